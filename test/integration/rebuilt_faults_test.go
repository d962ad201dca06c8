package integration_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

func westStatus(e *msync.Engine) string {
	s := ""
	for _, st := range e.Status() {
		if st.Cluster == "west" {
			s += fmt.Sprintf("[%s stale=%v ready=%v changes=%d err=%q] ", st.Name, st.Stale, st.Ready, st.ClusterChanges, st.Error)
		}
	}
	return s
}

// TestRestoreWithoutNamespaceRead: west read by a user that may not GET namespaces (RBAC): etcd
// restored from a backup, the apiserver restarted. The change is found
// by resourceVersion; the cluster must come back fresh once listed.
func TestRestoreWithoutNamespaceRead(t *testing.T) {
	testenv.Need(t, env)
	crd := filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")
	const ns, staleAfter = "rebuilt", 2 * time.Second
	west := restartableWest(t, crd, ns)
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"", "iidp.com"}, Resources: []string{"configmaps", "appmodels"}, Verbs: []string{"get", "list", "watch"}}}}
	if _, err := west.Kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := west.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "reader"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "reader"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, readerCfg := west.UserKubeconfig(t, "reader")
	proxy, err := testenv.NewProxy("127.0.0.1:0", west.APIServerAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	westCfg := rest.CopyConfig(readerCfg)
	westCfg.Host = "https://" + proxy.Addr()
	westCfg.Timeout = 5 * time.Second

	putConfigMap(t, env.Kube, ns, "east-1", "shop")
	putConfigMap(t, west.Kube, ns, "west-old", "shop")
	fill, err := west.BackupEtcdData(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	putConfigMap(t, west.Kube, ns, "west-gone", "shop")
	ensureNamespace(t, west.Kube, "filler")
	for i := range 50 {
		putConfigMap(t, west.Kube, "filler", "f"+strconv.Itoa(i), "filler")
	}
	e := runEngineWith(t, rebuiltPlan(t, ns), env.Config, msync.Options{StaleAfter: staleAfter,
		ClusterConfigs: map[string]*rest.Config{"west": westCfg}})
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "shop", "east-1:80", "west-gone:80", "west-old:80")
	time.Sleep(1500 * time.Millisecond)
	if err := proxy.Refuse(true); err != nil {
		t.Fatal(err)
	}
	if err := west.ReplaceEtcdData(fill, true); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Refuse(false); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "shop", "east-1:80", "west-old:80")
	t.Logf("converged data; west: %s", westStatus(e))
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop")); !a.Clusters["west"].Stale {
			t.Logf("west fresh again: %s", westStatus(e))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("west still stale 30 s after its (correct) data was listed: %s; clusters %+v", westStatus(e), e.Clusters())
}

// TestReloadWhileChangePending: west's etcd wiped under its running apiserver (the engine marks
// west stale until the apiserver is restarted); a reload that restarts a
// resource meanwhile.
func TestReloadWhileChangePending(t *testing.T) {
	testenv.Need(t, env)
	crd := filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")
	const ns, staleAfter = "rebuilt", 2 * time.Second
	west := restartableWest(t, crd, ns)
	putConfigMap(t, env.Kube, ns, "east-1", "shop")
	putConfigMap(t, west.Kube, ns, "west-old", "shop")
	westCfg := rest.CopyConfig(west.Config)
	westCfg.Timeout = 5 * time.Second
	plan := rebuiltPlan(t, ns)
	e := runEngineWith(t, plan, env.Config, msync.Options{StaleAfter: staleAfter,
		ClusterConfigs: map[string]*rest.Config{"west": westCfg}})
	wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "app-to-addr", "shop", "east-1:80", "west-old:80")
	if err := west.ReplaceEtcdData(nil, false); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "west stale", func() string {
		if a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop")); !a.Clusters["west"].Stale {
			return fmt.Sprintf("%+v", a)
		}
		return ""
	})
	t.Logf("pending: %s", westStatus(e))
	// A reload that restarts configmaps (resync added).
	cfg := &mschema.Config{
		Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/unused/in/code"}},
		Resources: []mschema.Resource{
			{Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns, Resync: time.Hour,
				Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}}},
			{Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels", Namespace: ns,
				Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}}},
		},
	}
	p2, err := mschema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := e.Reload(p2); err != nil || len(ch.Restart) == 0 {
		t.Fatalf("Reload = %+v, %v", ch, err)
	}
	found := ""
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
		if slices.Contains(a.Values, "west-old:80") && !a.Clusters["west"].Stale {
			found = fmt.Sprintf("%+v; %s", a, westStatus(e))
			break
		}
	}
	if found != "" {
		t.Errorf("ghost of the old west answered fresh after a reload while the change is pending: %s", found)
	}
	if err := west.RestartAPIServer(); err != nil {
		t.Fatal(err)
	}
}

// TestWarmEngineRebuiltCluster: a warm-started engine (its watches resumed from a snapshot) and
// west rebuilt behind its address (etcd wiped, apiserver restarted, more
// written than the engine's resourceVersion).
func TestWarmEngineRebuiltCluster(t *testing.T) {
	testenv.Need(t, env)
	crd := filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")
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
	putConfigMap(t, west.Kube, ns, "west-old", "shop")
	applyApp(t, west, ns, "old-app", "", 0, "m1")
	dir := t.TempDir()
	opts := msync.Options{StaleAfter: staleAfter, SnapshotDir: dir, SnapshotInterval: time.Hour,
		ClusterConfigs: map[string]*rest.Config{"west": westCfg}}
	plan := rebuiltPlan(t, ns)
	{
		opts.Logger = testLogger(t)
		e, err := msync.New(plan, env.Config, opts)
		if err != nil {
			t.Fatal(err)
		}
		stop := run(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := e.WaitForSync(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		expect(t, e, "model-to-app", "m1", "old-app")
		stop()
	}
	e := runEngineWith(t, plan, env.Config, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "warm, caught up", func() string {
		if e.Stale() {
			return "stale"
		}
		return ""
	})
	t.Logf("warm: %+v", e.Inspect().SnapshotStatus().Clusters)
	engineRV := latestRV(t, west, ns)
	time.Sleep(1500 * time.Millisecond)
	if err := proxy.Refuse(true); err != nil {
		t.Fatal(err)
	}
	if err := west.ReplaceEtcdData(nil, true); err != nil {
		t.Fatal(err)
	}
	ensureNamespace(t, west.Kube, ns)
	west.InstallCRDFile(t, crd)
	putConfigMap(t, west.Kube, ns, "west-new", "shop")
	applyApp(t, west, ns, "new-app", "", 0, "m1")
	ensureNamespace(t, west.Kube, "filler")
	for i := 0; latestRV(t, west, "filler") <= engineRV+20; i++ {
		putConfigMap(t, west.Kube, "filler", "f"+strconv.Itoa(i), "filler")
	}
	if err := proxy.Refuse(false); err != nil {
		t.Fatal(err)
	}
	msg := ""
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		a1 := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
		a2 := e.Inspect().Answer(msync.KeyOf("model-to-app", "m1"))
		msg = fmt.Sprintf("app-to-addr %q west stale %v; model-to-app %q west stale %v; %s",
			a1.Values, a1.Clusters["west"].Stale, a2.Values, a2.Clusters["west"].Stale, westStatus(e))
		if slices.Equal(a1.Values, []string{"east-1:80", "west-new:80"}) && slices.Equal(a2.Values, []string{"new-app"}) &&
			!a1.Clusters["west"].Stale && !a2.Clusters["west"].Stale {
			t.Logf("converged: %s", msg)
			return
		}
	}
	t.Errorf("30 s after west came back rebuilt: %s", msg)
}

// outage answers 503 to everything while down; lists of configmaps
// (not watches) take slow, and are counted.
type outage struct {
	next  http.RoundTripper
	down  atomic.Bool
	slow  time.Duration
	lists atomic.Int64
	cut   atomic.Int64 // lists cancelled before their answer
	mu    gosync.Mutex
	log   []string
}

func (o *outage) note(f string, a ...any) {
	o.mu.Lock()
	o.log = append(o.log, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(f, a...))
	o.mu.Unlock()
}

func (o *outage) RoundTrip(req *http.Request) (*http.Response, error) {
	if o.down.Load() {
		body := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"down","reason":"ServiceUnavailable","code":503}`
		return &http.Response{StatusCode: 503, Status: "503 Service Unavailable", Request: req,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body))}, nil
	}
	q := req.URL.Query()
	o.note("-> %s?%s", req.URL.Path, req.URL.RawQuery)
	if strings.HasSuffix(req.URL.Path, "/configmaps") && q.Get("watch") != "true" {
		o.lists.Add(1)
		select {
		case <-time.After(o.slow):
		case <-req.Context().Done():
			o.cut.Add(1)
			o.note("   cancelled in flight: %s", req.URL.Path)
			return nil, req.Context().Err()
		}
	}
	resp, err := o.next.RoundTrip(req)
	if err == nil {
		o.note("<- %d %s", resp.StatusCode, req.URL.Path)
	}
	return resp, err
}

// TestRecoveredLeavesListsInFlight: after an outage, one resource's
// recovery wakes the cluster's others, but never cancels a list under
// way.
func TestRecoveredLeavesListsInFlight(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "recovered-cancels"
	ensureNamespace(t, env.Kube, ns)
	putConfigMap(t, env.Kube, ns, "w1", "shop")
	applyApp(t, env, ns, "shop", "", 0, "m1")
	o := &outage{slow: 3 * time.Second}
	proxy, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(env))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	west := throughProxy(env, proxy)
	west.WrapTransport = func(next http.RoundTripper) http.RoundTripper { o.next = next; return o }
	plan, err := mschema.Compile(&mschema.Config{
		Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/unused"}},
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
	e := runEngineWith(t, plan, env.Config, msync.Options{StaleAfter: 5 * time.Second,
		ClusterConfigs: map[string]*rest.Config{"west": west}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	o.down.Store(true)
	proxy.Reset() // the open watches end; every request gets a 503
	putConfigMap(t, env.Kube, ns, "w2", "shop")
	time.Sleep(6 * time.Second)
	st0 := westStatus(e)
	lists0, cut0 := o.lists.Load(), o.cut.Load()
	o.down.Store(false)
	time.Sleep(15 * time.Second)
	t.Logf("before: %s", st0)
	t.Logf("after the outage: %d configmaps lists sent, %d cancelled in flight; %s", o.lists.Load()-lists0, o.cut.Load()-cut0, westStatus(e))
	o.mu.Lock()
	for _, l := range o.log {
		if strings.Contains(l, "503") {
			continue
		}
		t.Log(l)
	}
	o.mu.Unlock()
	if o.cut.Load() > cut0 {
		t.Errorf("configmaps' lists cancelled in flight by another resource's recovery: %d", o.cut.Load()-cut0)
	}
}
