package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/warmfile"
	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// listBlocker holds every LIST of AppModels until its request ends.
type listBlocker struct{ next http.RoundTripper }

func (b *listBlocker) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && r.URL.Query().Get("watch") != "true" && strings.HasSuffix(r.URL.Path, "/appmodels") {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return b.next.RoundTrip(r)
}

func blockingLists(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper { return &listBlocker{next} }
	return cfg
}

// bump writes configmap cm in ns n times: the cluster's resourceVersion
// moves by n.
func bump(t *testing.T, e *testenv.Env, ns string, n int) string {
	t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bump"}, Data: map[string]string{"i": "0"}}
	if _, err := e.Kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	got, err := e.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "bump", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := got.ResourceVersion
	for i := range n {
		got, err := e.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "bump", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Data = map[string]string{"i": fmt.Sprint(i)}
		got, err = e.Kube.CoreV1().ConfigMaps(ns).Update(ctx, got, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rv = got.ResourceVersion
	}
	return rv
}

// TestUnknownClusterSnapshotIsNotResumedAsThisOne: a snapshot that records no
// cluster (written by an engine that may not read kube-system) is not
// trusted to resume: it must be listed. A snapshot written on another
// cluster before that list completes must mark the unlisted data to be
// listed, whatever identity it records, so that the next start never
// resumes the first cluster's ghost and serves it as fresh.
func TestUnknownClusterSnapshotIsNotResumedAsThisOne(t *testing.T) {
	testenv.Need(t, env)
	ns := "trust-unknown"
	crd := filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")
	env.InstallCRDFile(t, crd)
	env.Namespace(t, ns)
	rvA := bump(t, env, ns, 400)
	applyApp(t, env, ns, "ghost", "10.66.66.66", 10, "model-a")
	plan, err := mschema.Compile(trustConfig(ns))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Cluster A, an engine with least privilege minus kube-system: its
	// snapshot records no cluster.
	user := appModelReader(t, "unknown-reader")
	dir := t.TempDir()
	snapshotOnce(t, user, plan, dir)
	f := decodeSnapshot(t, dir)
	t.Logf("A's snapshot: cluster %q, resourceVersion %s (A at %s)", f.Cluster, f.Resources[0].ResourceVersion, rvA)
	if f.Cluster != "" {
		t.Fatalf("expected a snapshot with no cluster, got %q", f.Cluster)
	}

	// Cluster B: its resourceVersion passes A's snapshot's, then it gets
	// its own object.
	b, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	b.InstallCRDFile(t, crd)
	b.Namespace(t, ns)
	rvB := bump(t, b, ns, 0)
	t.Logf("B after its CRD: %s", rvB)
	var aRV, bRV int
	fmt.Sscan(f.Resources[0].ResourceVersion, &aRV)
	fmt.Sscan(rvB, &bRV)
	// B's object before and after: the watch cache's window then covers
	// A's resourceVersion.
	applyApp(t, b, ns, "real", "10.0.0.6", 10, "model-b")
	if bRV < aRV+5 {
		bump(t, b, ns, aRV-bRV+5)
	}
	applyApp(t, b, ns, "real", "10.0.0.7", 10, "model-b")

	// B's first engine: the identity is read (unknown snapshot: list), the
	// list is slow (here: held), and the engine stops meanwhile.
	e1, logs1 := warm(t, blockingLists(b.Config), plan, dir)
	stop1 := run(t, e1)
	testenv.Eventually(t, "the unknown-cluster verdict", func() string {
		if !strings.Contains(logs1.String(), "does not say which cluster") {
			return "no verdict yet"
		}
		return ""
	})
	time.Sleep(300 * time.Millisecond)
	stop1()
	f = decodeSnapshot(t, dir)
	t.Logf("B's first snapshot: cluster %q, resource relist %v, resourceVersion %s", f.Cluster, f.Resources[0].Relist, f.Resources[0].ResourceVersion)
	data, _ := os.ReadFile(filepath.Join(dir, msync.SnapshotFile))
	if f.Cluster != "" && !f.Resources[0].Relist && strings.Contains(string(data), "10.66.66.66") {
		t.Errorf("never-verified data (A's ghost) written as cluster %q's, resumable", f.Cluster)
	}

	// B's second engine trusts it.
	e2, logs2 := warm(t, b.Config, plan, dir)
	run(t, e2)
	wctx2, cancel2 := context.WithTimeout(ctx, 30*time.Second)
	defer cancel2()
	if err := e2.WaitForSync(wctx2); err != nil {
		t.Fatalf("%v\n%s", err, logs2)
	}
	time.Sleep(time.Second)
	ghost, real := e2.Lookup("app-to-address", "ghost"), e2.Lookup("app-to-address", "real")
	t.Logf("B's second engine: ghost %v, real %v, stale %v, ready %v", ghost, real, e2.Stale(), e2.Ready())
	for _, l := range strings.Split(logs2.String(), "\n") {
		if strings.Contains(l, "listing") || strings.Contains(l, "caught up") || strings.Contains(l, "cluster") || strings.Contains(l, "trouble") {
			t.Log(l)
		}
	}
	if len(ghost) != 0 && !e2.Stale() && e2.Ready() {
		t.Errorf("cluster A's ghost served as fresh on cluster B: ghost → %v", ghost)
	}
}

func decodeSnapshot(t *testing.T, dir string) *warmfile.File {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, msync.SnapshotFile))
	if err != nil {
		t.Fatal(err)
	}
	f, err := warmfile.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestReloadCarriesNoDataOfAnotherCluster: cluster A's snapshot is loaded
// on cluster B, and a reload restarts the AppModel entry before its
// identity check (here before Start; during an outage alike). The check
// that finds "another cluster" must drop the data carried over the
// reload too, so that no snapshot written before the AppModel list
// completes records A's data under B's identity, and the next start on B
// never resumes A's ghost as fresh.
func TestReloadCarriesNoDataOfAnotherCluster(t *testing.T) {
	testenv.Need(t, env)
	ns := "trust-carried"
	crd := filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")
	env.InstallCRDFile(t, crd)
	env.Namespace(t, ns)
	env.Namespace(t, ns+"-bump")
	bump(t, env, ns+"-bump", 400)
	applyApp(t, env, ns, "ghost", "10.66.66.66", 10, "model-a")
	config := func(resync time.Duration) *mschema.Config {
		c := trustConfig(ns)
		c.Resources[0].Resync = resync
		c.Resources = append(c.Resources, mschema.Resource{Name: "cms", Version: "v1", Resource: "configmaps", Namespace: ns,
			Indexes: []mschema.Index{{Name: "cm-by-name", Key: "metadata.name"}}})
		return c
	}
	plan, err := mschema.Compile(config(0))
	if err != nil {
		t.Fatal(err)
	}
	reloaded, err := mschema.Compile(config(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	snapshotOnce(t, env.Config, plan, dir)
	f := decodeSnapshot(t, dir)
	t.Logf("A's snapshot: cluster %q", f.Cluster)
	var aRV int
	for _, r := range f.Resources {
		if r.Name == "appmodels" {
			fmt.Sscan(r.ResourceVersion, &aRV)
		}
	}

	b, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	b.InstallCRDFile(t, crd)
	b.Namespace(t, ns)
	b.Namespace(t, ns+"-bump")
	applyApp(t, b, ns, "real", "10.0.0.6", 10, "model-b")
	var bRV int
	fmt.Sscan(bump(t, b, ns+"-bump", 0), &bRV)
	if bRV < aRV+5 {
		bump(t, b, ns+"-bump", aRV-bRV+5)
	}
	applyApp(t, b, ns, "real", "10.0.0.7", 10, "model-b")

	e1, logs1 := warm(t, blockingLists(b.Config), plan, dir)
	if ch, err := e1.Reload(reloaded); err != nil || len(ch.Restart) != 1 {
		t.Fatalf("Reload: %+v, %v", ch, err)
	}
	stop1 := run(t, e1)
	testenv.Eventually(t, "the other-cluster verdict", func() string {
		if !strings.Contains(logs1.String(), "another cluster") {
			return "no verdict yet"
		}
		return ""
	})
	t.Logf("B's first engine, before its AppModel list: ghost %v, stale %v, ready %v", e1.Lookup("app-to-address", "ghost"), e1.Stale(), e1.Ready())
	time.Sleep(300 * time.Millisecond)
	stop1()
	f = decodeSnapshot(t, dir)
	data, _ := os.ReadFile(filepath.Join(dir, msync.SnapshotFile))
	for _, r := range f.Resources {
		t.Logf("B's first snapshot: cluster %q, %s relist %v rv %s", f.Cluster, r.Name, r.Relist, r.ResourceVersion)
	}
	if strings.Contains(string(data), "10.66.66.66") {
		t.Errorf("cluster B's snapshot (cluster %q) holds cluster A's ghost", f.Cluster)
	}

	e2, logs2 := warm(t, b.Config, reloaded, dir)
	run(t, e2)
	wctx2, cancel2 := context.WithTimeout(ctx, 30*time.Second)
	defer cancel2()
	if err := e2.WaitForSync(wctx2); err != nil {
		t.Fatalf("%v\n%s", err, logs2)
	}
	time.Sleep(time.Second)
	ghost, real := e2.Lookup("app-to-address", "ghost"), e2.Lookup("app-to-address", "real")
	t.Logf("B's second engine: ghost %v, real %v, stale %v, ready %v", ghost, real, e2.Stale(), e2.Ready())
	if len(ghost) != 0 && !e2.Stale() && e2.Ready() {
		t.Errorf("cluster A's ghost served as fresh on cluster B: ghost → %v", ghost)
	}
}
