package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// putConfigMap creates or updates a ConfigMap whose data.app is app.
func putConfigMap(t *testing.T, kube kubernetes.Interface, ns, name, app string) {
	t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"app": app, "addr": name + ":80"}}
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err == nil {
		return
	}
	if _, err := kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("put configmap %s/%s: %v", ns, name, err)
	}
}

func ensureNamespace(t *testing.T, kube kubernetes.Interface, ns string) {
	t.Helper()
	_, err := kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
}

// TestTwoClusters reads one config from two control planes (two
// apiservers, two etcds): the answers are the union of both, each value
// once; the second cluster, reached through a proxy, is cut off while
// the first goes on changing: the first's changes keep arriving, the
// second's part stays in the answers, marked stale in its cluster's
// state only once --stale-after has passed; back, the changes made
// meanwhile arrive and nothing of what was deleted stays.
func TestTwoClusters(t *testing.T) {
	testenv.Need(t, env)
	// West is cut off silently below (its connections stay open, nothing
	// comes through): client-go's HTTP/2 checks notice, as often as
	// metasync serve sets them from --stale-after.
	t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "1")
	t.Setenv("HTTP2_PING_TIMEOUT_SECONDS", "1")
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	const ns = "two-clusters"
	ensureNamespace(t, env.Kube, ns)
	ensureNamespace(t, west.Kube, ns)

	proxy, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(west))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	westCfg := throughProxy(west, proxy)
	westCfg.Timeout = 5 * time.Second

	plan, err := mschema.Compile(&mschema.Config{
		Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/unused/in/code"}},
		Resources: []mschema.Resource{{
			Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
			Indexes: []mschema.Index{
				{Name: "app-to-addr", Key: "data.app", Value: "data.addr"},
				{Name: "app-to-name", Key: "data.app"},
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	putConfigMap(t, env.Kube, ns, "e1", "shop")
	putConfigMap(t, west.Kube, ns, "w1", "shop")
	putConfigMap(t, env.Kube, ns, "same", "both")
	putConfigMap(t, west.Kube, ns, "same", "both")

	e := runEngineWith(t, plan, env.Config, msync.Options{StaleAfter: 2 * time.Second,
		ClusterConfigs: map[string]*rest.Config{"west": westCfg}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}

	// The union, each value once.
	expect(t, e, "app-to-addr", "shop", "e1:80", "w1:80")
	expect(t, e, "app-to-addr", "both", "same:80")
	expect(t, e, "app-to-name", "both", ns+"/same")
	if got := e.Status(); len(got) != 2 || got[0].Cluster != "east" || got[1].Cluster != "west" || got[0].Objects != 2 || got[1].Objects != 2 {
		t.Fatalf("status per cluster: %+v", got)
	}
	a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
	if !a.Synced || a.Stale || !a.Clusters["east"].Synced || !a.Clusters["west"].Synced || a.Clusters["west"].Stale {
		t.Fatalf("answer's clusters: %+v", a)
	}
	// One object deleted in one cluster: the value the other still gives
	// stays.
	if err := west.Kube.CoreV1().ConfigMaps(ns).Delete(context.Background(), "same", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	putConfigMap(t, west.Kube, ns, "w-gone", "both") // seen, then changed to another app
	expect(t, e, "app-to-addr", "both", "same:80", "w-gone:80")
	putConfigMap(t, west.Kube, ns, "w-gone", "moved")
	expect(t, e, "app-to-addr", "both", "same:80")

	// West cut off: east's changes keep arriving; west's part stays,
	// marked stale once StaleAfter has passed.
	proxy.BlackHole(true)
	putConfigMap(t, env.Kube, ns, "e2", "shop")
	expect(t, e, "app-to-addr", "shop", "e1:80", "e2:80", "w1:80")
	testenv.Eventually(t, "west stale in the answer, east not", func() string {
		a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
		if !a.Stale || !a.Clusters["west"].Stale || a.Clusters["east"].Stale {
			return fmt.Sprintf("%+v", a)
		}
		if !slices.Equal(a.Values, []string{"e1:80", "e2:80", "w1:80"}) {
			return fmt.Sprintf("values %q", a.Values)
		}
		return ""
	})
	var cs []msync.ClusterStatus
	testenv.Eventually(t, "west not connected in Clusters", func() string {
		cs = e.Clusters()
		if len(cs) != 2 || !cs[0].Connected || cs[1].Connected || !cs[1].Stale || cs[0].Stale || !cs[0].Home || cs[1].Home {
			return fmt.Sprintf("%+v", cs)
		}
		return ""
	})
	if e.Ready() {
		t.Errorf("ready while a required cluster is cut off: %+v", e.Status())
	}
	// Meanwhile in west: a delete and an add, which must arrive.
	if err := west.Kube.CoreV1().ConfigMaps(ns).Delete(context.Background(), "w1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	putConfigMap(t, west.Kube, ns, "w3", "shop")
	time.Sleep(time.Second)
	putConfigMap(t, env.Kube, ns, "e3", "shop")
	expect(t, e, "app-to-addr", "shop", "e1:80", "e2:80", "e3:80", "w1:80")

	// West back: caught up, nothing of w1 left, fresh again.
	proxy.BlackHole(false)
	expect(t, e, "app-to-addr", "shop", "e1:80", "e2:80", "e3:80", "w3:80")
	testenv.Eventually(t, "fresh and ready again", func() string {
		a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
		if a.Stale || a.Clusters["west"].Stale || !e.Ready() {
			return fmt.Sprintf("%+v ready=%v", a, e.Ready())
		}
		return ""
	})
	t.Logf("clusters while west was cut off: %+v", cs)
}

// TestOptionalClusterDoesNotHoldBackSync starts with a cluster that is
// not required and cannot be reached: the engine syncs and is ready on
// the required one, and the unreachable one is named in its status.
func TestOptionalClusterDoesNotHoldBackSync(t *testing.T) {
	testenv.Need(t, env)
	const ns = "optional-cluster"
	ensureNamespace(t, env.Kube, ns)
	putConfigMap(t, env.Kube, ns, "a", "shop")
	no := false
	plan, err := mschema.Compile(&mschema.Config{
		Clusters: []mschema.Cluster{{Name: "home"}, {Name: "away", Kubeconfig: "/unused", Required: &no}},
		Resources: []mschema.Resource{{
			Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
			Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	away := rest.CopyConfig(env.Config)
	away.Host = "https://" + testenv.FreeAddr(t) // nothing listens there
	away.Timeout = 2 * time.Second
	e := runEngineWith(t, plan, env.Config, msync.Options{StaleAfter: time.Second,
		ClusterConfigs: map[string]*rest.Config{"away": away}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "shop", "a:80")
	a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
	if !a.Synced || a.Clusters["away"].Synced {
		t.Fatalf("answer: %+v", a)
	}
	testenv.Eventually(t, "ready without the optional cluster", func() string {
		if !e.Ready() {
			return fmt.Sprintf("%+v", e.Status())
		}
		return ""
	})
	st := e.Status()
	if len(st) != 2 || !st[1].Optional || st[1].Synced || st[1].Error == "" {
		t.Fatalf("status of the unreachable optional cluster: %+v", st)
	}
}

// TestKubeconfigRotation rewrites a cluster's kubeconfig file while the
// engine runs: first to a new address (the old one then closes), then
// to garbage, as a write caught half-way would be. The new file is taken
// without a restart and no answer is ever empty; the garbage is refused,
// counted, and the last good connection goes on.
func TestKubeconfigRotation(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	const ns = "kubeconfig-rotation"
	ensureNamespace(t, env.Kube, ns)
	ensureNamespace(t, west.Kube, ns)
	putConfigMap(t, west.Kube, ns, "w1", "west-only")

	first, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(west))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(west))
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	file := filepath.Join(t.TempDir(), "west.kubeconfig")
	rewrite := func(body []byte) {
		t.Helper()
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, body, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	at := func(p *testenv.Proxy, addr ...string) []byte {
		if len(addr) == 0 {
			addr = append(addr, p.Addr())
		}
		b, err := os.ReadFile(west.WriteKubeconfig(t, addr[0]))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rewrite(at(first))

	plan, err := mschema.Compile(&mschema.Config{
		Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: file}},
		Resources: []mschema.Resource{{
			Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
			Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := runEngineWith(t, plan, env.Config, msync.Options{KubeconfigInterval: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "west-only", "w1:80")

	// A reader that looks all along: the answer must never empty.
	stop := make(chan struct{})
	looked := make(chan [2]int)
	go func() {
		looks, empty := 0, 0
		for {
			select {
			case <-stop:
				looked <- [2]int{looks, empty}
				return
			default:
			}
			if len(e.Lookup("app-to-addr", "west-only")) == 0 {
				empty++
			}
			looks++
			time.Sleep(time.Millisecond)
		}
	}()
	west1 := func() msync.ClusterStatus { return e.Clusters()[1] }

	rewrite(at(second))
	testenv.Eventually(t, "the new kubeconfig taken", func() string {
		if st := west1(); st.KubeconfigRotations != 1 {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	first.Close() // the old address is gone
	putConfigMap(t, west.Kube, ns, "w2", "west-only")
	expect(t, e, "app-to-addr", "west-only", "w1:80", "w2:80")

	rewrite([]byte("apiVersion: v1\nkind: Config\nclusters:\n- cluster: {server: https://"))
	testenv.Eventually(t, "the garbage refused", func() string {
		if st := west1(); st.KubeconfigErrors != 1 || st.KubeconfigError == "" || st.KubeconfigRotations != 1 {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	putConfigMap(t, west.Kube, ns, "w3", "west-only")
	expect(t, e, "app-to-addr", "west-only", "w1:80", "w2:80", "w3:80")
	close(stop)
	n := <-looked
	if n[1] != 0 {
		t.Fatalf("%d of %d looks answered nothing", n[1], n[0])
	}
	testenv.Eventually(t, "west connected through the new address", func() string {
		if st := west1(); !st.Connected || st.Stale || st.Error != "" {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	t.Logf("%d looks, none empty; west: %+v", n[0], west1())

	// A user whose apiserver answers but who may not list: refused
	// (its /version would have passed), the last good connection stays.
	noRights, _ := west.UserKubeconfig(t, "no-rights")
	body, err := os.ReadFile(noRights)
	if err != nil {
		t.Fatal(err)
	}
	rewrite(body)
	testenv.Eventually(t, "a kubeconfig that cannot list refused", func() string {
		if st := west1(); st.KubeconfigErrors < 2 || !strings.Contains(st.KubeconfigError, "cannot list and watch configmaps: HTTP 403 Forbidden") || st.KubeconfigRotations != 1 {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	putConfigMap(t, west.Kube, ns, "w4", "west-only")
	expect(t, e, "app-to-addr", "west-only", "w1:80", "w2:80", "w3:80", "w4:80")

	// A user who may list but not watch: refused too.
	west.ListOnlyRole(t, ns, "rotation-list-only")
	listOnly, _ := west.UserKubeconfig(t, "rotation-list-only")
	if body, err = os.ReadFile(listOnly); err != nil {
		t.Fatal(err)
	}
	errorsBefore := west1().KubeconfigErrors
	rewrite(body)
	testenv.Eventually(t, "a kubeconfig that cannot watch refused", func() string {
		if st := west1(); st.KubeconfigErrors <= errorsBefore || !strings.Contains(st.KubeconfigError, "HTTP 403 Forbidden: watch") || st.KubeconfigRotations != 1 {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})

	// An address where nothing answers yet: refused, and tried again
	// unchanged until it answers, then taken. The port is free when it
	// is picked; another process may take it before the proxy does: then
	// again, on another port.
	var later *testenv.Proxy
	for attempt := 1; later == nil; attempt++ {
		free, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(west))
		if err != nil {
			t.Fatal(err)
		}
		addr := free.Addr()
		free.Close()
		errorsBefore = west1().KubeconfigErrors
		rewrite(at(&testenv.Proxy{}, addr))
		testenv.Eventually(t, "a kubeconfig whose apiserver does not answer refused, twice", func() string {
			if st := west1(); st.KubeconfigErrors < errorsBefore+2 || st.KubeconfigRotations != 1 {
				return fmt.Sprintf("%+v", st)
			}
			return ""
		})
		later, err = testenv.NewProxy(addr, apiserverAddr(west))
		if err != nil && (attempt == 5 || !errors.Is(err, syscall.EADDRINUSE)) {
			t.Fatal(err)
		}
	}
	defer later.Close()
	testenv.Eventually(t, "the same kubeconfig taken once its apiserver answers", func() string {
		if st := west1(); st.KubeconfigRotations != 2 || st.KubeconfigError != "" {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	second.Close()
	putConfigMap(t, west.Kube, ns, "w5", "west-only")
	expect(t, e, "app-to-addr", "west-only", "w1:80", "w2:80", "w3:80", "w4:80", "w5:80")

	// A kubeconfig rewritten to reach another cluster (east's apiserver):
	// west's part is listed again through it, not resumed, so nothing
	// of the old cluster stays.
	putConfigMap(t, env.Kube, ns, "e1", "east-only")
	body, err = os.ReadFile(env.WriteKubeconfig(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	rewrite(body)
	expect(t, e, "app-to-addr", "west-only")
	expect(t, e, "app-to-addr", "east-only", "e1:80")
	testenv.Eventually(t, "west's part is east's objects", func() string {
		if st := west1(); st.KubeconfigRotations != 3 || st.Objects != 1 {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
}

// TestDropAfter cuts off a cluster with dropAfter: its part stays,
// stale, until dropAfter has passed, then leaves the answers (callers
// fail over to the other cluster) and comes back, with what changed
// meanwhile, once the cluster is reachable again.
func TestDropAfter(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	const ns = "drop-after"
	ensureNamespace(t, env.Kube, ns)
	ensureNamespace(t, west.Kube, ns)
	putConfigMap(t, env.Kube, ns, "e1", "shop")
	putConfigMap(t, west.Kube, ns, "w1", "shop")
	proxy, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(west))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	westCfg := throughProxy(west, proxy)
	westCfg.Timeout = 2 * time.Second
	plan, err := mschema.Compile(&mschema.Config{
		Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/unused", DropAfter: 3 * time.Second}},
		Resources: []mschema.Resource{{
			Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
			Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := runEngineWith(t, plan, env.Config, msync.Options{StaleAfter: time.Second,
		ClusterConfigs: map[string]*rest.Config{"west": westCfg}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "shop", "e1:80", "w1:80")
	time.Sleep(1500 * time.Millisecond) // the watch established

	proxy.BlackHole(true)
	proxy.Reset()
	cut := time.Now()
	testenv.Eventually(t, "west stale, still answered", func() string {
		a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
		if !a.Clusters["west"].Stale || !slices.Equal(a.Values, []string{"e1:80", "w1:80"}) {
			return fmt.Sprintf("%+v", a)
		}
		return ""
	})
	expect(t, e, "app-to-addr", "shop", "e1:80")
	if gone := time.Since(cut); gone < 3*time.Second {
		t.Errorf("west's part left after %v, before dropAfter", gone)
	}
	putConfigMap(t, west.Kube, ns, "w2", "shop")
	putConfigMap(t, env.Kube, ns, "e2", "shop")
	expect(t, e, "app-to-addr", "shop", "e1:80", "e2:80")

	proxy.BlackHole(false)
	expect(t, e, "app-to-addr", "shop", "e1:80", "e2:80", "w1:80", "w2:80")
	testenv.Eventually(t, "west fresh again", func() string {
		if a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop")); a.Stale || !e.Ready() {
			return fmt.Sprintf("%+v", a)
		}
		return ""
	})
}

// TestReloadAddsAndRemovesACluster: a reload that adds a cluster starts
// its watches only (the other cluster's keep theirs: no list, no new
// watch), and its part joins the answers; a reload that removes it again
// takes its part out.
func TestReloadAddsAndRemovesACluster(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	const ns = "reload-clusters"
	ensureNamespace(t, env.Kube, ns)
	ensureNamespace(t, west.Kube, ns)
	putConfigMap(t, env.Kube, ns, "e1", "shop")
	putConfigMap(t, west.Kube, ns, "w1", "shop")
	kubeconfig := west.WriteKubeconfig(t, "")
	compile := func(clusters ...mschema.Cluster) *mschema.Plan {
		t.Helper()
		plan, err := mschema.Compile(&mschema.Config{
			Clusters: clusters,
			Resources: []mschema.Resource{{
				Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
				Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}},
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return plan
	}
	e := runEngineWith(t, compile(mschema.Cluster{Name: "east"}), env.Config, msync.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "shop", "e1:80")
	time.Sleep(1100 * time.Millisecond) // east's watch established
	before := e.Status()[0]

	if _, err := e.Reload(compile(mschema.Cluster{Name: "east"}, mschema.Cluster{Name: "west", Kubeconfig: kubeconfig})); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "shop", "e1:80", "w1:80")
	st := e.Status()
	if len(st) != 2 || st[0].Cluster != "east" || st[1].Cluster != "west" {
		t.Fatalf("status after adding west: %+v", st)
	}
	if st[0].Watches != before.Watches || st[0].Relists != before.Relists {
		t.Errorf("east restarted by adding west: watches %d → %d, lists %d → %d", before.Watches, st[0].Watches, before.Relists, st[0].Relists)
	}

	// West's kubeconfig changed to a user who may list but not watch:
	// the reload is refused, west's connection goes on.
	west.ListOnlyRole(t, ns, "reload-list-only")
	listOnly, _ := west.UserKubeconfig(t, "reload-list-only")
	_, err = e.Reload(compile(mschema.Cluster{Name: "east"}, mschema.Cluster{Name: "west", Kubeconfig: listOnly}))
	if err == nil || !strings.Contains(err.Error(), "cluster west: the new connection cannot list and watch configmaps: HTTP 403 Forbidden: watch") {
		t.Fatalf("reload to a kubeconfig that cannot watch: %v", err)
	}
	putConfigMap(t, west.Kube, ns, "w2", "shop")
	expect(t, e, "app-to-addr", "shop", "e1:80", "w1:80", "w2:80")

	if _, err := e.Reload(compile(mschema.Cluster{Name: "east"})); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "shop", "e1:80")
	if st := e.Status(); len(st) != 1 || st[0].Watches != before.Watches || st[0].Relists != before.Relists {
		t.Errorf("status after removing west: %+v", st)
	}
	if cs := e.Clusters(); len(cs) != 1 || cs[0].Name != "east" {
		t.Errorf("clusters after removing west: %+v", cs)
	}
}

// relativeKubeconfig writes a kubeconfig of env's cluster at server
// ("": its own address) into dir, as one made from a Secret volume is:
// its certificate authority, client certificate and key (or token) in
// files beside it, named by relative paths.
func relativeKubeconfig(t *testing.T, env *testenv.Env, dir, server string) string {
	t.Helper()
	kc, err := clientcmd.Load(env.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return name
	}
	for _, c := range kc.Clusters {
		if server != "" {
			c.Server = "https://" + server
		}
		c.CertificateAuthority, c.CertificateAuthorityData = write("ca.crt", c.CertificateAuthorityData), nil
	}
	for _, a := range kc.AuthInfos {
		if len(a.ClientCertificateData) > 0 {
			a.ClientCertificate, a.ClientCertificateData = write("tls.crt", a.ClientCertificateData), nil
			a.ClientKey, a.ClientKeyData = write("tls.key", a.ClientKeyData), nil
		}
		if a.Token != "" {
			a.TokenFile, a.Token = write("token", []byte(a.Token)), ""
		}
	}
	b, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "-data:") {
		t.Fatalf("the kubeconfig still holds data inline:\n%s", b)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKubeconfigRelativePaths: a cluster's kubeconfig whose certificate,
// key and token files are named relative to it is taken at start, on a
// rotation (a new address) and on a reload (another folder), by the one
// loader of kubeconfigs; and a file written back to the content in use,
// after a write caught half-way, is no rotation.
func TestKubeconfigRelativePaths(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	// Stopped after the engine (cleanups run last first): a watch
	// left open would hold its shutdown.
	t.Cleanup(func() { _ = west.Stop() })
	const ns = "kubeconfig-relative"
	ensureNamespace(t, env.Kube, ns)
	ensureNamespace(t, west.Kube, ns)
	putConfigMap(t, west.Kube, ns, "w1", "west-only")
	proxy, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(west))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()

	dir := t.TempDir()
	file := relativeKubeconfig(t, west, dir, "")
	compile := func(kubeconfig string) *mschema.Plan {
		t.Helper()
		plan, err := mschema.Compile(&mschema.Config{
			Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: kubeconfig}},
			Resources: []mschema.Resource{{
				Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
				Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}},
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return plan
	}
	e := runEngineWith(t, compile(file), env.Config, msync.Options{KubeconfigInterval: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "west-only", "w1:80")
	west1 := func() msync.ClusterStatus { return e.Clusters()[1] }

	// A rotation: the same files, a new address.
	inUse := relativeKubeconfig(t, west, dir, proxy.Addr())
	testenv.Eventually(t, "the new kubeconfig taken", func() string {
		if st := west1(); st.KubeconfigRotations != 1 || st.KubeconfigErrors != 0 {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	putConfigMap(t, west.Kube, ns, "w2", "west-only")
	expect(t, e, "app-to-addr", "west-only", "w1:80", "w2:80")

	// Caught half-way, then written back as it was: refused, then no
	// rotation, and no refusal left in the status.
	good, err := os.ReadFile(inUse)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inUse, good[:len(good)/3], 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the half-written file refused", func() string {
		if st := west1(); st.KubeconfigErrors != 1 || st.KubeconfigError == "" {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	if err := os.WriteFile(inUse, good, 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the file back as it was: no refusal, no rotation", func() string {
		if st := west1(); st.KubeconfigError != "" || st.KubeconfigRotations != 1 {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	time.Sleep(500 * time.Millisecond) // five looks at the file
	if st := west1(); st.KubeconfigRotations != 1 {
		t.Errorf("a file written back to the content in use counted as a rotation: %+v", st)
	}

	// A reload to a kubeconfig in another folder, with files of its own.
	other := relativeKubeconfig(t, west, t.TempDir(), "")
	if _, err := e.Reload(compile(other)); err != nil {
		t.Fatalf("a reload to a kubeconfig with relative paths: %v", err)
	}
	putConfigMap(t, west.Kube, ns, "w3", "west-only")
	expect(t, e, "app-to-addr", "west-only", "w1:80", "w2:80", "w3:80")
	testenv.Eventually(t, "west connected after the reload", func() string {
		if st := west1(); !st.Connected || st.Error != "" || st.KubeconfigError != "" {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
}
