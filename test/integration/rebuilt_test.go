package integration_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// TestRebuiltClusterLeavesNoGhosts rebuilds west behind its address while
// the engine cannot reach it, in two ways: its etcd wiped and more written
// since than the engine's resourceVersion (the watch would resume there
// and never hear of the objects the cluster lost), and its etcd restored
// from a backup (its resourceVersions went back). West's address refuses
// connections meanwhile, as that of an apiserver that is down: client-go
// retries the watch at its resourceVersion without listing. No answer may
// hold an object of the old cluster marked fresh at any moment once
// --stale-after has passed since the cut, and the engine must converge to
// the new cluster, with the change counted.
func TestRebuiltClusterLeavesNoGhosts(t *testing.T) {
	testenv.Need(t, env)
	crd := filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")
	env.InstallCRDFile(t, crd)
	for _, c := range []rebuild{
		{name: "etcd wiped, the apiserver restarted", restartAPIServer: true},
		{name: "etcd wiped under the running apiserver, restarted later"},
		{name: "etcd restored from a backup", restore: true, restartAPIServer: true},
	} {
		t.Run(c.name, func(t *testing.T) { rebuildWest(t, crd, c) })
	}
}

// rebuild is how west is rebuilt: its etcd wiped or restored from a
// backup, its apiserver restarted (its address refusing connections
// meanwhile) or left running (it reconnects to the new etcd).
type rebuild struct {
	name                      string
	restore, restartAPIServer bool
}

func rebuildWest(t *testing.T, crd string, how rebuild) {
	restore := how.restore
	const ns, staleAfter = "rebuilt", 2 * time.Second
	west := restartableWest(t, crd, ns)
	proxy, err := testenv.NewProxy("127.0.0.1:0", west.APIServerAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	westCfg := throughProxy(west, proxy)
	westCfg.Timeout = 5 * time.Second

	putConfigMap(t, env.Kube, ns, "east-1", "shop")
	applyApp(t, env, ns, "east-app", "", 0, "m-east")
	putConfigMap(t, west.Kube, ns, "west-old", "shop")
	applyApp(t, west, ns, "old-app", "", 0, "m1")
	ghostAddr, ghostApp := "west-old:80", "old-app"
	var fill func(string) error
	if restore {
		if fill, err = west.BackupEtcdData(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		// Written after the backup: the restore loses them, and the
		// cluster's resourceVersion goes back by more than the writes of
		// an apiserver starting.
		putConfigMap(t, west.Kube, ns, "west-gone", "shop")
		applyApp(t, west, ns, "gone-app", "", 0, "m1")
		ensureNamespace(t, west.Kube, "filler")
		for i := range 50 {
			putConfigMap(t, west.Kube, "filler", "f"+strconv.Itoa(i), "filler")
		}
		ghostAddr, ghostApp = "west-gone:80", "gone-app"
	}
	e := runEngineWith(t, rebuiltPlan(t, ns), env.Config, msync.Options{StaleAfter: staleAfter,
		ClusterConfigs: map[string]*rest.Config{"west": westCfg}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	before := []string{"east-1:80", "west-old:80"}
	if restore {
		before = []string{"east-1:80", "west-gone:80", "west-old:80"}
	}
	expect(t, e, "app-to-addr", "shop", before...)
	if restore {
		expect(t, e, "model-to-app", "m1", "gone-app", "old-app")
	} else {
		expect(t, e, "model-to-app", "m1", "old-app")
	}
	engineRV := latestRV(t, west, ns)
	time.Sleep(1500 * time.Millisecond) // the watches established

	cutAt := time.Now()
	if err := proxy.Refuse(how.restartAPIServer); err != nil {
		t.Fatal(err)
	}
	// Refused, west's part is stale once StaleAfter has passed; left
	// running, the apiserver answers from its cache while etcd is away,
	// and the engine reads west's identity every second once it is back
	// (one GET, which a loaded machine may take a second to answer).
	var replacedAt atomic.Int64
	grace := func(now time.Time) bool {
		if how.restartAPIServer {
			return now.Sub(cutAt) > staleAfter+time.Second
		}
		at := replacedAt.Load()
		return at != 0 && now.Sub(time.Unix(0, at)) > identityEvery+2*time.Second
	}
	watch := watchForGhosts(e, cutAt, grace, ghostAddr, ghostApp)
	if err := west.ReplaceEtcdData(fill, how.restartAPIServer); err != nil {
		t.Fatal(err)
	}
	replacedAt.Store(time.Now().UnixNano())
	want := []string{"east-1:80", "west-old:80"}
	wantApp := "old-app"
	if !restore {
		// A new cluster: its namespace, CRD and objects, and more
		// written than the engine's resourceVersion.
		ensureNamespace(t, west.Kube, ns)
		west.InstallCRDFile(t, crd)
		putConfigMap(t, west.Kube, ns, "west-new", "shop")
		applyApp(t, west, ns, "new-app", "", 0, "m1")
		ensureNamespace(t, west.Kube, "filler")
		for i := 0; latestRV(t, west, "filler") <= engineRV+20; i++ {
			putConfigMap(t, west.Kube, "filler", "f"+strconv.Itoa(i), "filler")
		}
		want, wantApp = []string{"east-1:80", "west-new:80"}, "new-app"
	}
	if !how.restartAPIServer {
		// The apiserver left running serves the old cluster from its
		// cache, to every client: west's part stays marked stale until
		// it is restarted, as an apiserver must be after its etcd was
		// replaced.
		testenv.Eventually(t, "west stale while its apiserver serves the old cluster", func() string {
			if a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop")); !a.Clusters["west"].Stale {
				return fmt.Sprintf("%+v", a)
			}
			return ""
		})
		time.Sleep(2 * identityEvery)
		if a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop")); !a.Clusters["west"].Stale {
			t.Errorf("west fresh while its apiserver serves the old cluster: %+v", a)
		}
		if err := west.RestartAPIServer(); err != nil {
			t.Fatal(err)
		}
	}
	if err := proxy.Refuse(false); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "shop", want...)
	expect(t, e, "model-to-app", "m1", wantApp)
	testenv.Eventually(t, "west fresh, the change counted", func() string {
		a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
		changes := int64(0)
		for _, st := range e.Status() {
			if st.Cluster == "west" {
				changes += st.ClusterChanges
			}
		}
		if a.Stale || a.Clusters["west"].Stale || changes == 0 {
			return fmt.Sprintf("answer %+v, cluster changes %d", a, changes)
		}
		return ""
	})
	// The objects metric is what the index holds.
	for _, st := range e.Status() {
		if st.Cluster == "west" && st.Objects != 1 {
			t.Errorf("%s of west: %d objects, the cluster holds 1", st.Name, st.Objects)
		}
	}
	for _, v := range watch() {
		t.Error(v)
	}
}

// identityEvery is how often the engine reads a cluster's identity with
// a StaleAfter of 2 s.
const identityEvery = time.Second

// restartableWest starts west, a control plane whose etcd can be
// replaced, with the AppModel CRD of crd installed and namespace ns made
// in it and in env (east).
func restartableWest(t *testing.T, crd, ns string) *testenv.Env {
	t.Helper()
	env.InstallCRDFile(t, crd)
	west, err := testenv.StartRestartable(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = west.Stop() })
	west.InstallCRDFile(t, crd)
	ensureNamespace(t, env.Kube, ns)
	ensureNamespace(t, west.Kube, ns)
	return west
}

func rebuiltPlan(t *testing.T, ns string) *mschema.Plan {
	t.Helper()
	plan, err := mschema.Compile(&mschema.Config{
		Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/unused/in/code"}},
		Resources: []mschema.Resource{
			{Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
				Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}}},
			{Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels", Namespace: ns,
				Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// latestRV writes a ConfigMap in ns and returns its resourceVersion: the
// cluster's current one.
func latestRV(t *testing.T, e *testenv.Env, ns string) uint64 {
	t.Helper()
	cm, err := e.Kube.CoreV1().ConfigMaps(ns).Create(context.Background(),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "rv-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create in %s: %v", ns, err)
	}
	rv, err := strconv.ParseUint(cm.ResourceVersion, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return rv
}

// watchForGhosts reads the engine's answers every 10 ms until the
// returned function is called, and returns then the answers (the first
// five) read when past(now) that held ghostAddr or ghostApp, objects of
// the old cluster, with west's part not marked stale.
func watchForGhosts(e *msync.Engine, cutAt time.Time, past func(now time.Time) bool, ghostAddr, ghostApp string) func() []string {
	var mu gosync.Mutex
	var found []string
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			now := time.Now()
			for _, c := range []struct{ index, key, ghost string }{{"app-to-addr", "shop", ghostAddr}, {"model-to-app", "m1", ghostApp}} {
				a := e.Inspect().Answer(msync.KeyOf(c.index, c.key))
				if past(now) && slices.Contains(a.Values, c.ghost) && !a.Clusters["west"].Stale {
					mu.Lock()
					if len(found) < 5 {
						found = append(found, fmt.Sprintf("%s after the cut: %s[%s] = %q with west fresh (%+v)",
							now.Sub(cutAt).Round(time.Millisecond), c.index, c.key, a.Values, a.Clusters))
					}
					mu.Unlock()
				}
			}
		}
	}()
	return func() []string {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return found
	}
}
