package main_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/test/routingtest"
	"github.com/iidp/metasync/test/testenv"
)

// TestServeTwoClusters runs the daemon on a config of two clusters, two
// real control planes: east is the daemon's own connection, west comes
// from its kubeconfig file. The answers are the union with each
// cluster's state, GET /v1/clusters lists both, the metrics carry the
// cluster; west cut off, its part stays in the answers marked stale,
// /readyz names it and east's changes keep arriving.
func TestServeTwoClusters(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	// West through a proxy, which cuts it off.
	proxy, err := testenv.NewProxy("127.0.0.1:0", strings.TrimSuffix(strings.TrimPrefix(west.Config.Host, "https://"), "/"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const ns = "serve-two-clusters"
	env.Namespace(t, ns)
	west.Namespace(t, ns)
	put := func(e *testenv.Env, name, app string) { t.Helper(); putAddr(t, e, ns, name, app) }
	put(env, "e1", "shop")
	put(west, "w1", "shop")

	addr := testenv.FreeAddr(t)
	config := writeTwoClusters(t, addr, west.WriteKubeconfig(t, proxy.Addr()), ns)
	d := start(t, nil, "--config", config, "--kubeconfig", env.WriteKubeconfig(t, ""), "--stale-after", "2s")
	waitHTTP(t, d, addr)
	base := "http://" + addr
	testenv.Eventually(t, "the union of both clusters", func() string {
		a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop")
		if want := `{"index":"app-to-addr","key":"shop","values":["e1:80","w1:80"],"clusters":{"east":{"synced":true,"stale":false},"west":{"synced":true,"stale":false}}}`; strings.TrimSpace(a.raw) != want {
			return a.raw
		}
		return ""
	})
	if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop?cluster=west"); strings.TrimSpace(a.raw) != `{"index":"app-to-addr","key":"shop","values":["w1:80"],"clusters":{"west":{"synced":true,"stale":false}}}` {
		t.Fatalf("narrowed to west: %d %s", a.code, a.raw)
	}
	if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop?cluster=nowhere"); a.code != 400 || !strings.Contains(a.raw, `unknown cluster \"nowhere\" (known: east, west)`) {
		t.Fatalf("an unknown cluster: %d %s", a.code, a.raw)
	}
	twoClustersExplainedAndSD(t, base, ns)
	twoClustersResolver(t, base, ns, west)

	// A route that does not narrow by cluster refuses to seem to.
	for _, path := range []string{"/v1/indexes?cluster=west", "/v1/indexes/app-to-addr/keys?cluster=west", "/v1/clusters?cluster=west"} {
		if a := call(t, "GET", base+path); a.code != 400 || !strings.Contains(a.raw, "cluster= narrows lookups, chain lookups, their streams and /v1/sd answers, and picks an object's cluster") {
			t.Fatalf("%s: %d %s", path, a.code, a.raw)
		}
	}
	cl := call(t, "GET", base+"/v1/clusters")
	if !strings.Contains(cl.raw, `{"name":"east","home":true,"required":true,"connected":true,"synced":true,"stale":false,"lastContact":`) ||
		!strings.Contains(cl.raw, `{"name":"west","home":false,"required":true,"connected":true,"synced":true,"stale":false,"lastContact":`) {
		t.Fatalf("/v1/clusters: %s", cl.raw)
	}
	m := samples(t, base)
	for _, s := range []string{`metasync_resource_objects{cluster="west",resource="configmaps"}`, `metasync_resource_objects{cluster="east",resource="configmaps"}`, `metasync_cluster_connected{cluster="west"}`} {
		if m[s] != 1 {
			t.Errorf("%s = %v, want 1", s, m[s])
		}
	}
	if a := call(t, "GET", base+"/readyz"); a.code != 200 {
		t.Fatalf("/readyz: %d %s", a.code, a.raw)
	}
	st := follow(t, base+"/v1/indexes/app-to-addr/keys/shop?watch=true")
	testenv.Eventually(t, "a stream's snapshot frame with the clusters", func() string {
		st.mu.Lock()
		defer st.mu.Unlock()
		if len(st.frames) == 0 {
			return "no frame"
		}
		if cs, _ := st.frames[0]["clusters"].(map[string]any); len(cs) != 2 {
			return fmt.Sprint(st.frames[0])
		}
		return ""
	})

	twoClustersWestStream(t, base, ns, west, put)

	// West unreachable.
	proxy.BlackHole(true)
	proxy.Reset()
	put(env, "e2", "shop")
	testenv.Eventually(t, "west's part kept, stale; east's change in", func() string {
		a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop")
		if want := `{"index":"app-to-addr","key":"shop","values":["e1:80","e2:80","w1:80"],"stale":true,"clusters":{"east":{"synced":true,"stale":false},"west":{"synced":true,"stale":true}}}`; strings.TrimSpace(a.raw) != want {
			return a.raw
		}
		return ""
	})
	r := call(t, "GET", base+"/readyz")
	if r.code != 503 || !strings.Contains(r.raw, "configmaps in cluster west") {
		t.Fatalf("/readyz with west gone: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, "west not connected", func() string {
		if m := samples(t, base); m[`metasync_cluster_connected{cluster="west"}`] != 0 || m[`metasync_cluster_stale{cluster="west"}`] != 1 || m[`metasync_cluster_connected{cluster="east"}`] != 1 {
			return fmt.Sprint(m[`metasync_cluster_connected{cluster="west"}`], m[`metasync_cluster_stale{cluster="west"}`])
		}
		return ""
	})
}

// twoClustersExplainedAndSD: explained, narrowed to west, the daemon at
// base gives west's part and west's objects only; not narrowed, both, with
// every cluster's state. Prometheus' http_sd has one group per key and
// cluster, labelled.
func twoClustersExplainedAndSD(t *testing.T, base, ns string) {
	if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop?cluster=west&explain=true"); a.code != 200 ||
		!strings.Contains(a.raw, `"values":["w1:80"]`) || !strings.Contains(a.raw, `"key":"`+ns+`/w1","cluster":"west"`) || strings.Contains(a.raw, `"cluster":"east"`) ||
		!strings.Contains(a.raw, `"clusters":{"west":{"synced":true,"stale":false}}`) {
		t.Fatalf("explained, narrowed to west: %d %s", a.code, a.raw)
	}
	if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop?explain=true"); a.code != 200 ||
		!strings.Contains(a.raw, `"key":"`+ns+`/w1","cluster":"west"`) || !strings.Contains(a.raw, `"key":"`+ns+`/e1","cluster":"east"`) ||
		!strings.Contains(a.raw, `"clusters":{"east":{"synced":true,"stale":false},"west":{"synced":true,"stale":false}}`) {
		t.Fatalf("explained: %d %s", a.code, a.raw)
	}
	if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop?cluster=west&explain=true&watch=true"); a.code != 400 {
		t.Fatalf("explained stream narrowed to west: %d %s", a.code, a.raw)
	}
	// Prometheus' http_sd: one group per key and cluster, labelled.
	if a := getRaw(t, "GET", base+"/v1/sd/indexes/app-to-addr"); strings.TrimSpace(a.raw) != `[{"targets":["e1:80"],"labels":{"__meta_metasync_cluster":"east","__meta_metasync_index":"app-to-addr","__meta_metasync_key":"shop"}},{"targets":["w1:80"],"labels":{"__meta_metasync_cluster":"west","__meta_metasync_index":"app-to-addr","__meta_metasync_key":"shop"}}]` {
		t.Fatalf("http_sd of two clusters: %d %s", a.code, a.raw)
	}
	if a := getRaw(t, "GET", base+"/v1/sd/indexes/app-to-addr?cluster=west"); strings.TrimSpace(a.raw) != `[{"targets":["w1:80"],"labels":{"__meta_metasync_cluster":"west","__meta_metasync_index":"app-to-addr","__meta_metasync_key":"shop"}}]` {
		t.Fatalf("http_sd narrowed to west: %d %s", a.code, a.raw)
	}
}

// twoClustersResolver: the gRPC resolver through the daemon at base calls
// the home cluster's backend while it has one, the other cluster's (west)
// when it has none, home again; then the backends are deleted.
func twoClustersResolver(t *testing.T, base, ns string, west *testenv.Env) {
	homeB, otherB := routingtest.StartBackend(t), routingtest.StartBackend(t)
	backend := func(e *testenv.Env, name, addr string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"app": "grpc", "addr": addr}}
		if _, err := e.Kube.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	backend(env, "grpc-east", homeB.Addr)
	backend(west, "grpc-west", otherB.Addr)
	conn := routingtest.Dial(t, "metasync:///indexes/app-to-addr/grpc", grpcresolver.NewRemoteBuilder(base, grpcresolver.WithLogger(slog.New(slog.DiscardHandler))))
	routingtest.Within(t, 10*time.Second, "calls stay in the home cluster", func() bool {
		return routingtest.Spread(t, conn, 20, homeB, otherB)[homeB] == 20
	})
	if err := env.Kube.CoreV1().ConfigMaps(ns).Delete(context.Background(), "grpc-east", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	routingtest.Within(t, 10*time.Second, "calls go to the other cluster", func() bool {
		return routingtest.Spread(t, conn, 20, homeB, otherB)[otherB] == 20
	})
	backend(env, "grpc-east", homeB.Addr)
	routingtest.Within(t, 10*time.Second, "calls come back home", func() bool {
		return routingtest.Spread(t, conn, 20, homeB, otherB)[homeB] == 20
	})
	conn.Close()
	for _, e := range []*testenv.Env{env, west} {
		for _, name := range []string{"grpc-east", "grpc-west"} {
			_ = e.Kube.CoreV1().ConfigMaps(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	}
	testenv.Eventually(t, "the backends' entries gone", func() string {
		if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/grpc"); !strings.Contains(a.raw, `"values":[]`) {
			return a.raw
		}
		return ""
	})
}

// twoClustersWestStream: a stream narrowed to west gets west's part, west's
// state, west's changes (put writes an object of either cluster); a
// stream of an unknown cluster is a JSON 400.
func twoClustersWestStream(t *testing.T, base, ns string, west *testenv.Env, put func(e *testenv.Env, name, app string)) {
	if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop?cluster=nowhere&watch=true"); a.code != 400 || !strings.Contains(a.raw, `"error":"unknown cluster \"nowhere\" (known: east, west)"`) {
		t.Fatalf("a stream of an unknown cluster: %d %s", a.code, a.raw)
	}
	ws := follow(t, base+"/v1/indexes/app-to-addr/keys/shop?cluster=west&watch=true")
	westFrames := func(want ...string) {
		t.Helper()
		testenv.Eventually(t, fmt.Sprintf("west's stream at %q", want), func() string {
			ws.mu.Lock()
			defer ws.mu.Unlock()
			var frames []map[string]any
			for _, f := range ws.frames {
				if f["type"] != "heartbeat" {
					frames = append(frames, f)
				}
			}
			if len(frames) != len(want) {
				return fmt.Sprint(ws.frames)
			}
			for i, f := range frames {
				cs, _ := f["clusters"].(map[string]any)
				if fmt.Sprint(f["values"]) != want[i] || len(cs) != 1 || cs["west"] == nil || f["stale"] != nil {
					return fmt.Sprint(frames)
				}
			}
			return ""
		})
	}
	westFrames("[w1:80]")
	put(env, "e-only", "shop") // east's: nothing for west's stream
	put(west, "w2", "shop")
	westFrames("[w1:80]", "[w1:80 w2:80]")
	if err := west.Kube.CoreV1().ConfigMaps(ns).Delete(context.Background(), "w2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := env.Kube.CoreV1().ConfigMaps(ns).Delete(context.Background(), "e-only", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	westFrames("[w1:80]", "[w1:80 w2:80]", "[w1:80]")
	testenv.Eventually(t, "east's e-only gone", func() string {
		if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop"); !strings.Contains(a.raw, `"values":["e1:80","w1:80"]`) {
			return a.raw
		}
		return ""
	})
}

// TestValidateClusters: validate reads each cluster's kubeconfig (a
// missing one is a problem naming the field), and --cluster checks the
// config against every cluster.
func TestValidateClusters(t *testing.T) {
	testenv.Need(t, env)
	const ns = "validate-clusters"
	env.Namespace(t, ns)
	dir := t.TempDir()
	write := func(kubeconfig string, only ...string) string {
		config := filepath.Join(dir, "config.yaml")
		narrowed := ""
		if len(only) > 0 {
			narrowed = "\n    clusters: [" + strings.Join(only, ", ") + "]"
		}
		body := fmt.Sprintf(`clusters:
  - name: east
  - name: west
    kubeconfig: %s
resources:
  - name: configmaps
    version: v1
    resource: configmaps
    namespace: %s%s
    indexes:
      - name: app-to-addr
        key: data.app
`, kubeconfig, ns, narrowed)
		if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return config
	}
	_, errOut, code := metasync(t, "validate", write("missing.kubeconfig"))
	if code != 1 || !strings.Contains(errOut, "clusters[1].kubeconfig: "+filepath.Join(dir, "missing.kubeconfig")) {
		t.Fatalf("a missing kubeconfig: exit %d\n%s", code, errOut)
	}
	out, errOut, code := metasync(t, "validate", "--cluster", "--kubeconfig", env.WriteKubeconfig(t, ""), write(env.WriteKubeconfig(t, "")))
	if code != 0 || !strings.Contains(out, "valid: 1 resource, 1 index, 0 chains (checked against the cluster)") {
		t.Fatalf("validate --cluster of two clusters: exit %d\n%s\n%s", code, out, errOut)
	}
	// West's user may read nothing: an entry read in west is a problem
	// there; one narrowed to east is not checked in west.
	nobody, _ := env.UserKubeconfig(t, "validate-nobody")
	_, errOut, code = metasync(t, "validate", "--cluster", "--kubeconfig", env.WriteKubeconfig(t, ""), write(nobody))
	if code != 1 || !strings.Contains(errOut, "cluster west: resources[0]") {
		t.Fatalf("validate --cluster, west may read nothing: exit %d\n%s", code, errOut)
	}
	out, errOut, code = metasync(t, "validate", "--cluster", "--kubeconfig", env.WriteKubeconfig(t, ""), write(nobody, "east"))
	if code != 0 || strings.Contains(errOut, "cluster west") {
		t.Fatalf("validate --cluster, the entry narrowed to east: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestServeTwoClustersWarm: `metasync serve --snapshot-dir` of two
// clusters (two control planes) stops and starts again while west cannot
// be reached: it answers at once from the snapshot, both clusters' parts,
// west's marked stale while east's catches up and is not; west's part
// alone answers ?cluster=west; once west is back, a change made there
// while the daemon was down is in the answer, and nothing is stale.
func TestServeTwoClustersWarm(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	westAddr := testenv.FreeAddr(t)
	westTarget := strings.TrimSuffix(strings.TrimPrefix(west.Config.Host, "https://"), "/")
	proxy, err := testenv.NewProxy(westAddr, westTarget)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { proxy.Close() }()
	const ns = "serve-two-clusters-warm"
	env.Namespace(t, ns)
	west.Namespace(t, ns)
	put := func(e *testenv.Env, name, app string) { t.Helper(); putAddr(t, e, ns, name, app) }
	put(env, "e1", "shop")
	put(west, "w1", "shop")
	addr := testenv.FreeAddr(t)
	config := writeTwoClusters(t, addr, west.WriteKubeconfig(t, westAddr), ns)
	snapDir := filepath.Join(t.TempDir(), "snapshots")
	args := []string{"--config", config, "--kubeconfig", env.WriteKubeconfig(t, ""), "--stale-after", "1s", "--snapshot-dir", snapDir}
	d := start(t, nil, args...)
	waitHTTP(t, d, addr)
	base := "http://" + addr
	both := `"values":["e1:80","w1:80"]`
	testenv.Eventually(t, "the union of both clusters", func() string {
		if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop"); !strings.Contains(a.raw, both) || strings.Contains(a.raw, `"stale":true`) {
			return a.raw
		}
		return ""
	})
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.done
	if d.err != nil || !strings.Contains(d.stderr.String(), `"msg":"snapshot written"`) {
		t.Fatalf("serve exited with %v, snapshot written: %v\n%s", d.err, strings.Contains(d.stderr.String(), `"msg":"snapshot written"`), d.stderr)
	}

	// While it is down, west gains w2; then west cannot be reached.
	put(west, "w2", "shop")
	proxy.Close()
	d = start(t, nil, args...)
	waitHTTP(t, d, addr)
	if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop"); !strings.Contains(a.raw, both) {
		t.Fatalf("right after the warm start: %s", a.raw)
	}
	testenv.Eventually(t, "east caught up, west stale", func() string {
		a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop")
		if !strings.Contains(a.raw, both) || !strings.Contains(a.raw, `"clusters":{"east":{"synced":true,"stale":false},"west":{"synced":true,"stale":true}}`) {
			return a.raw
		}
		return ""
	})
	if a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop?cluster=west"); !strings.Contains(a.raw, `"values":["w1:80"]`) || !strings.Contains(a.raw, `"stale":true`) {
		t.Fatalf("west's part from the snapshot: %s", a.raw)
	}

	// West is back: its change while the daemon was down comes in.
	if proxy, err = testenv.NewProxy(westAddr, westTarget); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "west caught up", func() string {
		a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop")
		if !strings.Contains(a.raw, `"values":["e1:80","w1:80","w2:80"]`) || strings.Contains(a.raw, `"stale":true`) {
			return a.raw
		}
		return ""
	})
	if log := d.stderr.String(); !strings.Contains(log, `"msg":"warm start from the snapshot"`) {
		t.Errorf("no warm start logged:\n%s", log)
	}
}

// putAddr creates ConfigMap name in ns of e, of app, at address name:80.
func putAddr(t *testing.T, e *testenv.Env, ns, name, app string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"app": app, "addr": name + ":80"}}
	if _, err := e.Kube.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// writeTwoClusters writes a config that serves on addr and reads the
// ConfigMaps of ns in east (the daemon's own connection) and west
// (westKubeconfig), indexed app-to-addr; it returns its path.
func writeTwoClusters(t *testing.T, addr, westKubeconfig, ns string) string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "config.yaml")
	body := fmt.Sprintf(`server:
  listen: %s
clusters:
  - name: east
  - name: west
    kubeconfig: %s
resources:
  - name: configmaps
    version: v1
    resource: configmaps
    namespace: %s
    indexes:
      - name: app-to-addr
        key: data.app
        value: data.addr
`, addr, westKubeconfig, ns)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return config
}

// TestServeChainNarrowedByLastStep: a platform keeps its "AppModels" in
// one cluster and its workloads in both. ?cluster= on a chain narrows
// its last step: west's endpoints of a model whose AppModel is in east
// alone, in a lookup, its explanation, a stream and /v1/sd.
func TestServeChainNarrowedByLastStep(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = west.Stop() })
	const ns = "serve-chain-last-step"
	env.Namespace(t, ns)
	west.Namespace(t, ns)
	model := func(e *testenv.Env, name, model, app string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"model": model, "app": app}}
		if _, err := e.Kube.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
			cm.ResourceVersion = ""
			if _, err := e.Kube.CoreV1().ConfigMaps(ns).Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	model(env, "am", "m1", "shop") // the AppModel: in east alone
	putAddr(t, env, ns, "e1", "shop")
	putAddr(t, west, ns, "w1", "shop")

	addr := testenv.FreeAddr(t)
	config := filepath.Join(t.TempDir(), "config.yaml")
	body := fmt.Sprintf(`server:
  listen: %s
clusters:
  - name: east
  - name: west
    kubeconfig: %s
resources:
  - name: configmaps
    version: v1
    resource: configmaps
    namespace: %s
    indexes:
      - name: model-to-app
        key: data.model
        value: data.app
      - name: app-to-addr
        key: data.app
        value: data.addr
chains:
  - name: model-to-addr
    indexes: [model-to-app, app-to-addr]
`, addr, west.WriteKubeconfig(t, ""), ns)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, nil, "--config", config, "--kubeconfig", env.WriteKubeconfig(t, ""))
	waitHTTP(t, d, addr)
	base := "http://" + addr
	lookup := func(query, want string) {
		t.Helper()
		testenv.Eventually(t, "model-to-addr m1"+query+" answers "+want, func() string {
			a := call(t, "GET", base+"/v1/chains/model-to-addr/keys/m1"+query)
			if !strings.Contains(a.raw, `"values":`+want) {
				return a.raw
			}
			return ""
		})
	}
	lookup("", `["e1:80","w1:80"]`)
	lookup("?cluster=west", `["w1:80"]`)
	lookup("?cluster=east", `["e1:80"]`)

	// Explained: the first step the whole answer's (east's AppModel),
	// the last west's objects alone.
	a := call(t, "GET", base+"/v1/chains/model-to-addr/keys/m1?cluster=west&explain=true")
	if a.code != 200 || !strings.Contains(a.raw, ns+`/am"`) || !strings.Contains(a.raw, ns+`/w1"`) || strings.Contains(a.raw, ns+`/e1"`) {
		t.Fatalf("explained, narrowed to west: %d %s", a.code, a.raw)
	}
	// Prometheus' http_sd: west's group of m1.
	if sd := getRaw(t, "GET", base+"/v1/sd/chains/model-to-addr?cluster=west"); !strings.Contains(sd.raw, `"targets":["w1:80"]`) {
		t.Fatalf("/v1/sd narrowed to west: %s", sd.raw)
	}

	// A stream narrowed to west follows west's endpoints, and the
	// AppModel's move in east.
	ws := follow(t, base+"/v1/chains/model-to-addr/keys/m1?cluster=west&watch=true")
	frames := func(want ...string) {
		t.Helper()
		testenv.Eventually(t, fmt.Sprintf("west's stream at %q", want), func() string {
			ws.mu.Lock()
			defer ws.mu.Unlock()
			var got []string
			for _, f := range ws.frames {
				if f["type"] != "heartbeat" {
					got = append(got, fmt.Sprint(f["values"]))
				}
			}
			if !slices.Equal(got, want) {
				return fmt.Sprint(got)
			}
			return ""
		})
	}
	frames("[w1:80]")
	putAddr(t, west, ns, "w2", "shop")
	frames("[w1:80]", "[w1:80 w2:80]")
	putAddr(t, west, ns, "wc", "cart")
	model(env, "am", "m1", "cart") // the AppModel moves to cart, in east
	frames("[w1:80]", "[w1:80 w2:80]", "[wc:80]")
}
