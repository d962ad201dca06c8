package integration_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/warmfile"
	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// trustConfig indexes the AppModels of ns: model → app, and app → the
// address in its annotation.
func trustConfig(ns string) *mschema.Config {
	return &mschema.Config{Resources: []mschema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels", Namespace: ns,
		Indexes: []mschema.Index{
			{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"},
			{Name: "app-to-address", Key: "metadata.name", Value: `metadata.annotations.address`},
		},
	}}}
}

// applyApp writes AppModel name of ns with its models, an address and
// padding bytes (which make its events large).
func applyApp(t *testing.T, e *testenv.Env, ns, name, address string, padding int, models ...any) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "iidp.com/v1", "kind": "AppModel",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"iidp": "iidp"},
			"annotations": map[string]any{"address": address, "padding": strings.Repeat("x", padding)}},
		"spec": map[string]any{"type": "model", "version": "1", "models": models},
	}}
	if _, err := e.Dynamic.Resource(appModelGVR).Namespace(ns).Apply(context.Background(), name, obj,
		metav1.ApplyOptions{FieldManager: "trust", Force: true}); err != nil {
		t.Fatalf("apply %s/%s: %v", ns, name, err)
	}
}

// listCounter counts the LIST requests that pass it.
type listCounter struct {
	next  http.RoundTripper
	lists atomic.Int64
}

func (c *listCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && r.URL.Query().Get("watch") != "true" && strings.HasSuffix(r.URL.Path, "/appmodels") {
		c.lists.Add(1)
	}
	return c.next.RoundTrip(r)
}

// counting returns a copy of cfg whose LIST requests of AppModels c
// counts.
func counting(cfg *rest.Config, c *listCounter) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper {
		c.next = next
		return c
	}
	return cfg
}

// warm builds an engine with a snapshot folder on cfg.
func warm(t *testing.T, cfg *rest.Config, plan *mschema.Plan, dir string) (*msync.Engine, *testenv.Buffer) {
	t.Helper()
	logs := &testenv.Buffer{}
	e, err := msync.New(plan, cfg, msync.Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		StaleAfter: 2 * time.Second, SnapshotDir: dir, SnapshotInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return e, logs
}

// run starts e and returns its stop, which waits for Start to return
// (and so for the snapshot written at the stop).
func run(t *testing.T, e *msync.Engine) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Start(ctx); close(done) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// snapshotOnce runs an engine on cfg until it has synced, then stops it:
// dir holds its snapshot.
func snapshotOnce(t *testing.T, cfg *rest.Config, plan *mschema.Plan, dir string) {
	t.Helper()
	e, logs := warm(t, cfg, plan, dir)
	stop := run(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	stop()
}

// appModelReader returns the config of a user who may read AppModels and
// nothing else (not the kube-system namespace, the cluster's identity).
func appModelReader(t *testing.T, name string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	_, user := env.UserKubeconfig(t, name)
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"iidp.com"}, Resources: []string{"appmodels"}, Verbs: []string{"get", "list", "watch"}}}}
	if _, err := env.Kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}}}
	if _, err := env.Kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return user
}

// throughProxy returns a copy of env's config that reaches the apiserver
// through p.
func throughProxy(e *testenv.Env, p *testenv.Proxy) *rest.Config {
	cfg := rest.CopyConfig(e.Config)
	cfg.Host = "https://" + p.Addr()
	return cfg
}

func apiserverAddr(e *testenv.Env) string {
	return strings.TrimSuffix(strings.TrimPrefix(e.Config.Host, "https://"), "/")
}

// TestWarmStartIsStaleUntilCaughtUp restarts an engine from a snapshot
// after many updates, through a slow link: the resumed watch takes
// seconds to replay them. Until it has delivered the apiserver's state as
// of the restart, the engine must say stale and not ready, and WaitForSync
// must wait: an answer that is wrong must never be marked fresh.
func TestWarmStartIsStaleUntilCaughtUp(t *testing.T) {
	testenv.Need(t, env)
	ns := "trust-catchup"
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, ns)
	const apps, rounds, padding = 60, 6, 2000
	for i := range apps {
		applyApp(t, env, ns, fmt.Sprintf("app-%02d", i), "10.0.0.1", 10, fmt.Sprintf("m-%02d-r0", i))
	}
	plan, err := mschema.Compile(trustConfig(ns))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	snapshotOnce(t, env.Config, plan, dir)

	// While no engine runs: rounds × apps updates of large objects; the
	// last round names each app's final model and address.
	for r := 1; r <= rounds; r++ {
		for i := range apps {
			applyApp(t, env, ns, fmt.Sprintf("app-%02d", i), fmt.Sprintf("10.0.%d.%d", r, i), padding, fmt.Sprintf("m-%02d-r%d", i, r))
		}
	}
	want := map[string][]string{}
	for i := range apps {
		want[fmt.Sprintf("m-%02d-r%d", i, rounds)] = []string{fmt.Sprintf("app-%02d", i)}
	}
	current := func(e *msync.Engine) (wrong int) {
		for k, vs := range want {
			if !slices.Equal(e.Lookup("model-to-app", k), vs) {
				wrong++
			}
		}
		return wrong
	}

	proxy, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(env))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	// About apps × rounds × (padding + the object) bytes to replay: some
	// seconds at this rate.
	proxy.Throttle(200 << 10)
	lists := &listCounter{}
	e, logs := warm(t, counting(throughProxy(env, proxy), lists), plan, dir)
	if st := e.Inspect().SnapshotStatus(); st.Load != "warm" {
		t.Fatalf("not a warm start: %+v\n%s", st, logs)
	}
	if current(e) != apps {
		t.Fatalf("the snapshot already answers the updates made after it")
	}
	synced := make(chan time.Time, 1)
	go func() {
		if e.WaitForSync(context.Background()) == nil {
			synced <- time.Now()
		}
	}()
	start := time.Now()
	run(t, e)
	// Every look: if the engine says it is current, every answer must be.
	freshButWrong, looks := 0, 0
	var caughtUp time.Duration
	for time.Since(start) < 60*time.Second {
		// Read the state first: answers read after it are as new or newer.
		fresh := !e.Stale() && e.Ready()
		wrong := current(e)
		looks++
		if fresh && wrong > 0 {
			freshButWrong++
			if freshButWrong == 1 {
				t.Errorf("after %v: not stale and ready while %d of %d answers are the snapshot's", time.Since(start).Round(time.Millisecond), wrong, apps)
			}
		}
		if fresh && wrong == 0 {
			caughtUp = time.Since(start)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if caughtUp == 0 {
		t.Fatalf("not caught up in 60 s\n%s", logs)
	}
	select {
	case at := <-synced:
		if w := current(e); w != 0 {
			t.Errorf("WaitForSync returned at %v while %d answers were the snapshot's", at.Sub(start), w)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("WaitForSync did not return once caught up")
	}
	t.Logf("caught up after %v through a %d KiB/s link; %d looks, %d fresh but wrong", caughtUp.Round(time.Millisecond), 200, looks, freshButWrong)
	if !strings.Contains(logs.String(), "reached the apiserver's") || lists.lists.Load() != 0 {
		t.Errorf("no log of the catch-up, or %d LISTs (a resume needs none):\n%s", lists.lists.Load(), logs)
	}
}

// TestSnapshotOfAnotherClusterIsIgnored loads a snapshot of one cluster
// on another: its data (an address only the first cluster has) is
// dropped, the engine starts cold and answers the second cluster's truth,
// and the second cluster's own snapshots never hold the ghost.
func TestSnapshotOfAnotherClusterIsIgnored(t *testing.T) {
	testenv.Need(t, env)
	ns := "trust-cluster"
	crd := filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")
	env.InstallCRDFile(t, crd)
	env.Namespace(t, ns)
	applyApp(t, env, ns, "ghost", "10.66.66.66", 10, "model-a")
	plan, err := mschema.Compile(trustConfig(ns))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	snapshotOnce(t, env.Config, plan, dir)

	b, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	b.InstallCRDFile(t, crd)
	b.Namespace(t, ns)
	applyApp(t, b, ns, "real", "10.0.0.7", 10, "model-b")
	// Move B's resourceVersion past A's snapshot's, as a busy cluster's
	// would be: the only check before was that the snapshot is not newer.
	for i := range 30 {
		applyApp(t, b, ns, "real", fmt.Sprintf("10.0.1.%d", i), 10, "model-b")
	}
	applyApp(t, b, ns, "real", "10.0.0.7", 10, "model-b")

	e, logs := warm(t, b.Config, plan, dir)
	if got := e.Lookup("app-to-address", "ghost"); !slices.Equal(got, []string{"10.66.66.66"}) {
		t.Fatalf("before the start, the snapshot answers %v", got)
	}
	if !e.Stale() || e.Ready() {
		t.Errorf("before the start: stale %v ready %v", e.Stale(), e.Ready())
	}
	stopB := run(t, e)
	wctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	if err := e.WaitForSync(wctx2); err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	testenv.Eventually(t, "cluster B's truth", func() string {
		ghost, real := e.Lookup("app-to-address", "ghost"), e.Lookup("app-to-address", "real")
		if len(ghost) != 0 || !slices.Equal(real, []string{"10.0.0.7"}) || !e.Ready() || e.Stale() {
			return fmt.Sprintf("ghost %v, real %v, ready %v, stale %v", ghost, real, e.Ready(), e.Stale())
		}
		return ""
	})
	if st := e.Inspect().SnapshotStatus(); st.Load != "cold" || st.LoadReason != "cluster" {
		t.Errorf("snapshot status %+v, want a cold start for another cluster", st)
	}
	if !strings.Contains(logs.String(), "another cluster") {
		t.Errorf("the reason is not logged:\n%s", logs)
	}
	stopB()
	data, err := os.ReadFile(filepath.Join(dir, msync.SnapshotFile))
	if err != nil {
		t.Fatal(err)
	}
	f, err := warmfile.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "10.66.66.66") || f.Cluster == "" {
		t.Errorf("cluster B's snapshot (cluster %q) holds cluster A's ghost, or no cluster", f.Cluster)
	}
}

// TestReloadInAnOutageKeepsTheSnapshot reloads a config that restarts the
// AppModel entry while the apiserver cannot be reached, then stops: the
// snapshot still holds every object, and an engine restarted still in the
// outage answers the last known state, stale.
func TestReloadInAnOutageKeepsTheSnapshot(t *testing.T) {
	testenv.Need(t, env)
	ns := "trust-reload"
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, ns)
	const apps = 40
	for i := range apps {
		applyApp(t, env, ns, fmt.Sprintf("app-%02d", i), "10.0.0.1", 10, fmt.Sprintf("m-%02d", i))
	}
	cfg := trustConfig(ns)
	plan, err := mschema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	snapshotOnce(t, env.Config, plan, dir)

	outage := rest.CopyConfig(env.Config)
	outage.Host = "https://" + testenv.FreeAddr(t) // nothing listens
	for _, c := range []struct {
		name   string
		change func(*mschema.Config)
	}{
		{"resync", func(c *mschema.Config) { c.Resources[0].Resync = time.Hour }},
		{"index rule", func(c *mschema.Config) {
			c.Resources[0].Indexes = append([]mschema.Index{{Name: "app-by-name", Key: "metadata.name"}}, c.Resources[0].Indexes...)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, logs := warm(t, outage, plan, dir)
			stop := run(t, e)
			next := trustConfig(ns)
			c.change(next)
			nextPlan, err := mschema.Compile(next)
			if err != nil {
				t.Fatal(err)
			}
			if ch, err := e.Reload(nextPlan); err != nil || len(ch.Restart) != 1 {
				t.Fatalf("Reload: %+v, %v", ch, err)
			}
			time.Sleep(500 * time.Millisecond)
			stop()
			if st := e.Inspect().SnapshotStatus(); st.Objects != apps {
				t.Errorf("the snapshot written at the stop holds %d objects, want %d\n%s", st.Objects, apps, logs)
			}
			again, logs := warm(t, outage, nextPlan, dir)
			if st := again.Inspect().SnapshotStatus(); st.Load != "warm" {
				t.Fatalf("restart in the outage: %+v\n%s", st, logs)
			}
			run(t, again)
			if got := again.Lookup("model-to-app", "m-07"); !slices.Equal(got, []string{"app-07"}) || !again.Stale() || again.Ready() {
				t.Errorf("restart in the outage: m-07 → %v, stale %v, ready %v; want the last known state, stale", got, again.Stale(), again.Ready())
			}
			plan = nextPlan
		})
	}
}

// TestSnapshotPathThatIsNoFile: a FIFO or a device at the snapshot's path
// is refused at once (a read would block for a writer, or never end), and
// the temporary files of a killed write are removed.
func TestSnapshotPathThatIsNoFile(t *testing.T) {
	plan, err := mschema.Compile(trustConfig("ns"))
	if err != nil {
		t.Fatal(err)
	}
	fifo := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(fifo, msync.SnapshotFile), 0o600); err != nil {
		t.Fatal(err)
	}
	device := t.TempDir()
	if err := os.Symlink("/dev/zero", filepath.Join(device, msync.SnapshotFile)); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{"fifo": fifo, "/dev/zero": device} {
		done := make(chan *msync.Engine, 1)
		go func() {
			e, _ := warm(t, &rest.Config{Host: "https://127.0.0.1:1"}, plan, dir)
			done <- e
		}()
		select {
		case e := <-done:
			if st := e.Inspect().SnapshotStatus(); st.Load != "cold" || st.LoadReason != "unreadable" {
				t.Errorf("%s: %+v, want a cold start, unreadable", name, st)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s at the snapshot's path: New does not return", name)
		}
	}
	dir := t.TempDir()
	left := filepath.Join(dir, ".snapshot-123456")
	if err := os.WriteFile(left, []byte("half a snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	warm(t, &rest.Config{Host: "https://127.0.0.1:1"}, plan, dir)
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("the temporary file of a killed write is still there: %v", err)
	}
}

// TestSnapshotWhoseClusterCannotBeRead: with RBAC that does not let the
// engine read the kube-system namespace, the snapshot is not resumed:
// it answers, stale, until the resource's list, which brings the
// cluster's truth; with the one Role the manifests grant, it resumes.
func TestSnapshotWhoseClusterCannotBeRead(t *testing.T) {
	testenv.Need(t, env)
	ns := "trust-rbac"
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, ns)
	applyApp(t, env, ns, "app", "10.0.0.1", 10, "model-x")
	plan, err := mschema.Compile(trustConfig(ns))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	snapshotOnce(t, env.Config, plan, dir)
	applyApp(t, env, ns, "app", "10.0.0.2", 10, "model-y")

	user := appModelReader(t, "trust-reader")
	e, logs := warm(t, user, plan, dir)
	run(t, e)
	testenv.Eventually(t, "the cluster's truth after a list", func() string {
		if got := e.Lookup("model-to-app", "model-y"); !slices.Equal(got, []string{"app"}) || e.Stale() || !e.Ready() {
			return fmt.Sprintf("model-y → %v, stale %v, ready %v", got, e.Stale(), e.Ready())
		}
		return ""
	})
	if !strings.Contains(logs.String(), "cannot read the cluster's identity") || !strings.Contains(logs.String(), "resource caught up by a list") {
		t.Errorf("no log of the unreadable identity and the list:\n%s", logs)
	}
}
