package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

var (
	env *testenv.Env
	bin string
)

func TestMain(m *testing.M) {
	if os.Getenv(xdsCallerEnv) != "" {
		os.Exit(xdsCaller())
	}
	dir, err := os.MkdirTemp("", "metasync-e2e-")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "metasync")
	out, err := exec.Command("go", "build", "-race", "-o", bin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build metasync: %v\n%s", err, out)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	testenv.MainLeakChecked(m, &env)
}

type daemon struct {
	cmd    *exec.Cmd
	stderr *testenv.Buffer
	done   chan struct{}
	err    error
}

// start runs `metasync serve` with args and extra environment.
func start(t *testing.T, envv []string, args ...string) *daemon {
	t.Helper()
	return startIn(t, "", envv, args...)
}

// startIn is start in the working folder dir ("": the test's).
func startIn(t *testing.T, dir string, envv []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{stderr: &testenv.Buffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin, append([]string{"serve"}, args...)...)
	d.cmd.Dir = dir
	d.cmd.Env = append(os.Environ(), envv...)
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.done
		// The binary is built with -race: a race it reports fails the
		// test that ran it.
		if strings.Contains(d.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("metasync serve reported a data race:\n%s", d.stderr)
		} else if t.Failed() {
			t.Logf("metasync serve stderr:\n%s", d.stderr)
		}
	})
	return d
}

// waitHTTP waits until addr answers /livez.
func waitHTTP(t *testing.T, d *daemon, addr string) {
	t.Helper()
	testenv.Eventually(t, "metasync serve answers on "+addr, func() string {
		select {
		case <-d.done:
			t.Fatalf("metasync serve exited: %v\n%s", d.err, d.stderr)
		default:
		}
		resp, err := http.Get("http://" + addr + "/livez")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		return ""
	})
}

type answer struct {
	code  int
	ctype string
	body  map[string]any
	raw   string
}

func call(t *testing.T, method, url string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{code: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), raw: string(raw)}
	if strings.HasPrefix(a.ctype, "application/json") {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			t.Fatalf("%s %s: bad JSON %q: %v", method, url, raw, err)
		}
	}
	return a
}

func wantJSON(t *testing.T, a answer, code int, want string) {
	t.Helper()
	if a.code != code || a.ctype != "application/json" {
		t.Fatalf("answer %d %q %s, want %d application/json", a.code, a.ctype, a.raw, code)
	}
	if want != "" && strings.TrimSpace(a.raw) != want {
		t.Fatalf("body = %s\nwant   %s", strings.TrimSpace(a.raw), want)
	}
}

var lateCRD = testenv.LooseCRD("late.iidp.com", "Widget", "widgets")

func writeConfig(t *testing.T, listen string) string {
	t.Helper()
	cfg := fmt.Sprintf(`
server:
  listen: %s
resources:
  - name: appmodels
    group: iidp.com
    version: v1
    resource: appmodels
    namespace: e2e
    labelSelector: iidp=iidp
    fields: {type: spec.type, version: spec.version, models: spec.models}
    indexes:
      - name: model-to-app
        key: spec.models
        value: metadata.name
      - name: object-to-type
        key: '${metadata.namespace}/${metadata.name}'
        value: spec.type
  - name: endpointslices
    group: discovery.k8s.io
    version: v1
    resource: endpointslices
    namespace: e2e
    labelSelector: kubernetes.io/service-name
    indexes:
      - name: service-to-addresses
        key: 'metadata.labels.kubernetes\.io/service-name'
        value: 'endpoints.#(conditions.ready==true)#.addresses|@flatten'
  - name: widgets
    group: late.iidp.com
    version: v1
    resource: widgets
    indexes:
      - name: widget-color
        key: spec.color
chains:
  - name: model-to-addresses
    indexes: [model-to-app, service-to-addresses]
`, listen)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// setupCluster installs the AppModel CRD and the objects of the e2e
// namespace: AppModel base and the Service base with two slices.
func setupCluster(t *testing.T) {
	t.Helper()
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, "e2e")
	manifest := `
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: base, namespace: e2e, labels: {iidp: iidp}}
spec: {type: model, version: "1.7", models: [model1, model2, model3]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: base-a, namespace: e2e, labels: {kubernetes.io/service-name: base}}
addressType: IPv4
endpoints:
- addresses: ["10.0.0.5"]
  conditions: {ready: true}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: base-b, namespace: e2e, labels: {kubernetes.io/service-name: base}}
addressType: IPv4
endpoints:
- addresses: ["10.0.0.6"]
  conditions: {ready: true}
- addresses: ["10.0.0.7"]
  conditions: {ready: false}
`
	path := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, path); err != nil {
		t.Fatal(err)
	}
}

func metasync(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

func TestServeEndToEnd(t *testing.T) {
	testenv.Need(t, env)
	setupCluster(t)
	addr := testenv.FreeAddr(t)
	config := writeConfig(t, addr)
	kubeconfig := env.WriteKubeconfig(t, "")
	d := start(t, nil, "--config", config, "--kubeconfig", kubeconfig)
	waitHTTP(t, d, addr)
	base := "http://" + addr

	// Before the sync completes: the widgets CRD is missing, so /readyz is
	// 503 and says why, while /livez is fine.
	wantJSON(t, call(t, "GET", base+"/livez"), 200, `{"status":"ok"}`)
	testenv.Eventually(t, "readyz names the missing CRD", func() string {
		a := call(t, "GET", base+"/readyz?verbose")
		if a.code == 503 && strings.Contains(a.raw, `"name":"widgets","ready":false`) && strings.Contains(a.raw, "could not find the requested resource") {
			return ""
		}
		return a.raw
	})
	// Without ?verbose: which resources, not why (no apiserver errors).
	if a := call(t, "GET", base+"/readyz"); a.code != 503 || a.body["resources"] != nil ||
		!strings.Contains(a.raw, `"widgets: not synced"`) || strings.Contains(a.raw, "could not find") {
		t.Fatalf("plain /readyz = %d %s", a.code, a.raw)
	}
	// The other resources serve meanwhile.
	testenv.Eventually(t, "appmodels serve before widgets", func() string {
		a := call(t, "GET", base+"/v1/indexes/model-to-app/keys/model1")
		if strings.TrimSpace(a.raw) == `{"index":"model-to-app","key":"model1","values":["base"]}` {
			return ""
		}
		return a.raw
	})

	// The CRD appears: the resource starts by itself and /readyz turns 200.
	env.InstallCRD(t, lateCRD)
	testenv.Eventually(t, "readyz 200 after the CRD appears", func() string {
		a := call(t, "GET", base+"/readyz")
		if a.code == 200 {
			return ""
		}
		return a.raw
	})
	wantJSON(t, call(t, "GET", base+"/readyz"), 200, `{"status":"ok"}`)

	e2eHTTPTable(t, base)
	e2eMetrics(t, base)
	e2eGet(t, base)

	// A watch event reaches the API.
	apply := `
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: late, namespace: e2e, labels: {iidp: iidp}}
spec: {type: model, version: "2", models: [model9]}
`
	path := filepath.Join(t.TempDir(), "late.yaml")
	_ = os.WriteFile(path, []byte(apply), 0o600)
	if err := kubeapply.Files(context.Background(), env.Config, path); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "model9 served", func() string {
		a := call(t, "GET", base+"/v1/indexes/model-to-app/keys/model9")
		if strings.Contains(a.raw, `"values":["late"]`) {
			return ""
		}
		return a.raw
	})

	// SIGTERM: a clean stop.
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		t.Fatal("metasync serve did not stop within 15s of SIGTERM")
	}
	if d.err != nil {
		t.Fatalf("exit after SIGTERM: %v", d.err)
	}
	logs := d.stderr.String()
	for _, want := range []string{`"msg":"stopping: /readyz fails from now on"`, `"msg":"engine stopped"`, `"msg":"stopped"`, `"msg":"initial sync done"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s", want)
		}
	}
}

// e2eHTTPTable: every row of the HTTP table, served at base once all
// of TestServeEndToEnd's resources are synced.
func e2eHTTPTable(t *testing.T, base string) {
	wantJSON(t, call(t, "GET", base+"/v1/indexes"), 200,
		`{"indexes":[{"name":"model-to-app","resource":"appmodels","keys":3,"synced":true},{"name":"object-to-type","resource":"appmodels","keys":1,"synced":true},{"name":"service-to-addresses","resource":"endpointslices","keys":1,"synced":true},{"name":"widget-color","resource":"widgets","keys":0,"synced":true}]}`)
	wantJSON(t, call(t, "GET", base+"/v1/indexes/model-to-app/keys"), 200, `{"index":"model-to-app","keys":["model1","model2","model3"]}`)
	wantJSON(t, call(t, "GET", base+"/v1/indexes/model-to-app/keys?limit=2"), 200, `{"index":"model-to-app","keys":["model1","model2"],"continue":"kbW9kZWwy"}`)
	wantJSON(t, call(t, "GET", base+"/v1/indexes/model-to-app/keys?limit=2&continue=kbW9kZWwy"), 200, `{"index":"model-to-app","keys":["model3"]}`)
	wantJSON(t, call(t, "GET", base+"/v1/indexes/model-to-app/keys/model2"), 200, `{"index":"model-to-app","key":"model2","values":["base"]}`)
	wantJSON(t, call(t, "GET", base+"/v1/indexes/model-to-app/keys/nothing"), 200, `{"index":"model-to-app","key":"nothing","values":[]}`)
	wantJSON(t, call(t, "GET", base+"/v1/chains/model-to-addresses/keys/model1"), 200, `{"chain":"model-to-addresses","key":"model1","values":["10.0.0.5","10.0.0.6"]}`)
	wantJSON(t, call(t, "GET", base+"/v1/indexes/nope/keys/model1"), 404, `{"error":"unknown index \"nope\" (known: model-to-app, object-to-type, service-to-addresses, widget-color)"}`)
	wantJSON(t, call(t, "GET", base+"/v1/indexes/nope/keys"), 404, `{"error":"unknown index \"nope\" (known: model-to-app, object-to-type, service-to-addresses, widget-color)"}`)
	wantJSON(t, call(t, "GET", base+"/v1/chains/nope/keys/model1"), 404, `{"error":"unknown chain \"nope\" (known: model-to-addresses)"}`)
	wantJSON(t, call(t, "GET", base+"/v1/indexes/object-to-type/keys/e2e%2Fbase"), 200, `{"index":"object-to-type","key":"e2e/base","values":["model"]}`)
	wantJSON(t, call(t, "GET", base+"/v1/indexes/model-to-app/keys?limit=x"), 400, "")
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		a := call(t, m, base+"/v1/indexes/model-to-app/keys/model2")
		wantJSON(t, a, 405, fmt.Sprintf(`{"error":"method %s not allowed; use GET"}`, m))
	}
	wantJSON(t, call(t, "GET", base+"/nowhere"), 404, `{"error":"no such endpoint: /nowhere"}`)
}

// e2eMetrics: /metrics at base is Prometheus text, metasync_ names, no
// index key as a label.
func e2eMetrics(t *testing.T, base string) {
	m := call(t, "GET", base+"/metrics")
	if m.code != 200 || !strings.HasPrefix(m.ctype, "text/plain") {
		t.Fatalf("/metrics = %d %q", m.code, m.ctype)
	}
	for _, line := range []string{
		`metasync_resource_objects{resource="appmodels"} 1`,
		`metasync_resource_objects{resource="endpointslices"} 2`,
		`metasync_resource_synced{resource="widgets"} 1`,
		`metasync_resource_ready{resource="appmodels"} 1`,
		`metasync_index_keys{index="model-to-app",resource="appmodels"} 3`,
		`metasync_relists_total{resource="appmodels"} 1`,
		`metasync_rule_errors_total{index="model-to-app",resource="appmodels"} 0`,
		`metasync_lookups_total{kind="index",name="model-to-app",result="hit"}`,
		`metasync_lookups_total{kind="chain",name="model-to-addresses",result="hit"} 1`,
		`metasync_watch_starts_total{resource="appmodels"}`,
		`metasync_events_total{resource="appmodels",type="added"} 0`,
		`metasync_list_errors_total{resource="widgets"}`,
	} {
		if !strings.Contains(m.raw, line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	if strings.Contains(m.raw, "model2") || strings.Contains(m.raw, "10.0.0.5") {
		t.Error("/metrics carries an index key or value")
	}
}

// e2eGet: metasync get against the daemon at base, of an index, a chain,
// a key with a slash, an unknown index and a server that is not there.
func e2eGet(t *testing.T, base string) {
	if out, errOut, code := metasync(t, "get", "--server", base, "model-to-app", "model2"); code != 0 || out != "base\n" {
		t.Fatalf("get = %q %q %d", out, errOut, code)
	}
	if out, _, code := metasync(t, "get", "--server", base, "--chain", "model-to-addresses", "model1"); code != 0 || out != "10.0.0.5\n10.0.0.6\n" {
		t.Fatalf("get --chain = %q %d", out, code)
	}
	if out, _, code := metasync(t, "get", "--server", base, "object-to-type", "e2e/base"); code != 0 || out != "model\n" {
		t.Fatalf("get with a slash = %q %d", out, code)
	}
	if _, errOut, code := metasync(t, "get", "--server", base, "nope", "x"); code != 1 || !strings.Contains(errOut, `unknown index "nope"`) {
		t.Fatalf("get of an unknown index = %q %d", errOut, code)
	}
	if _, errOut, code := metasync(t, "get", "--server", "http://"+testenv.FreeAddr(t), "model-to-app", "x"); code != 1 || !strings.Contains(errOut, "cannot reach metasync at") {
		t.Fatalf("get of a dead server = %q %d", errOut, code)
	}
}

func TestInvalidConfigStartsNothing(t *testing.T) {
	bad := filepath.Join(testenv.Root(), "schema", "testdata", "five-mistakes.bad.yaml")
	_, errOut, code := metasync(t, "serve", "--config", bad, "--kubeconfig", "/nonexistent")
	if code != 1 || !strings.Contains(errOut, "resources[1].indexes[0].key: empty gjson path") || !strings.Contains(errOut, `"msg":"invalid config: nothing started"`) || strings.Contains(errOut, `"msg":"serving"`) {
		t.Fatalf("serve with a bad config: exit %d\n%s", code, errOut)
	}
}

func TestListenPrecedence(t *testing.T) {
	testenv.Need(t, env)
	kubeconfig := env.WriteKubeconfig(t, "")
	fileAddr, envAddr, flagAddr := testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t)
	config := writeConfig(t, fileAddr)

	d := start(t, nil, "--config", config, "--kubeconfig", kubeconfig)
	waitHTTP(t, d, fileAddr)

	d = start(t, []string{"METASYNC_LISTEN=" + envAddr}, "--config", config, "--kubeconfig", kubeconfig)
	waitHTTP(t, d, envAddr)

	d = start(t, []string{"METASYNC_LISTEN=" + envAddr}, "--config", config, "--kubeconfig", kubeconfig, "--listen", flagAddr)
	waitHTTP(t, d, flagAddr)
	// The listener may answer before the log line has crossed the pipe.
	testenv.Eventually(t, "the log names the flag's address", func() string {
		if !strings.Contains(d.stderr.String(), `"address":"`+flagAddr+`"`) {
			return "the flag did not win: " + d.stderr.String()
		}
		return ""
	})
}

// TestApiserverUnreachableThenBack starts the daemon against an address
// where no apiserver listens: it stays up, /readyz says why, and it syncs
// by itself once the apiserver is reachable there.
func TestApiserverUnreachableThenBack(t *testing.T) {
	testenv.Need(t, env)
	setupCluster(t)
	apiAddr := testenv.FreeAddr(t)
	addr := testenv.FreeAddr(t)
	config := writeConfig(t, addr)
	d := start(t, nil, "--config", config, "--kubeconfig", env.WriteKubeconfig(t, apiAddr), "--stale-after", "1s")
	waitHTTP(t, d, addr)
	testenv.Eventually(t, "readyz says connection refused", func() string {
		a := call(t, "GET", base(addr)+"/readyz?verbose")
		if a.code == 503 && strings.Contains(a.raw, "connection refused") {
			return ""
		}
		return a.raw
	})
	target := strings.TrimPrefix(env.Config.Host, "https://")
	target = strings.TrimSuffix(target, "/")
	proxy, err := testenv.NewProxy(apiAddr, target)
	if err != nil {
		t.Fatal(err)
	}
	env.InstallCRD(t, lateCRD)
	testenv.Eventually(t, "ready once the apiserver is reachable", func() string {
		a := call(t, "GET", base(addr)+"/readyz?verbose")
		if a.code == 200 {
			return ""
		}
		return a.raw
	})
	wantJSON(t, call(t, "GET", base(addr)+"/v1/indexes/model-to-app/keys/model2"), 200, `{"index":"model-to-app","key":"model2","values":["base"]}`)

	// The apiserver goes away later: /readyz turns 503 with the reason once
	// the watch has failed longer than --stale-after; lookups keep serving
	// the last known truth, marked stale (an answer never looks current
	// while its source is cut off); it recovers by itself.
	proxy.Close()
	testenv.Eventually(t, "readyz 503 while the apiserver is gone", func() string {
		a := call(t, "GET", base(addr)+"/readyz?verbose")
		if a.code == 503 && strings.Contains(a.raw, "watch failing for") {
			return ""
		}
		return a.raw
	})
	testenv.Eventually(t, "lookups marked stale while the apiserver is gone", func() string {
		a := call(t, "GET", base(addr)+"/v1/indexes/model-to-app/keys/model2")
		if a.code == 200 && strings.Contains(a.raw, `"values":["base"]`) && strings.Contains(a.raw, `"stale":true`) {
			return ""
		}
		return a.raw
	})
	if !strings.Contains(d.stderr.String(), "answers are stale") {
		t.Errorf("the log does not say the answers are stale:\n%s", d.stderr.String())
	}
	proxy, err = testenv.NewProxy(apiAddr, target)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	testenv.Eventually(t, "ready again once the apiserver is back", func() string {
		a := call(t, "GET", base(addr)+"/readyz?verbose")
		if a.code == 200 {
			return ""
		}
		return a.raw
	})
	testenv.Eventually(t, "lookups current again", func() string {
		a := call(t, "GET", base(addr)+"/v1/indexes/model-to-app/keys/model2")
		if a.code == 200 && !strings.Contains(a.raw, `"stale"`) {
			return ""
		}
		return a.raw
	})
	wantJSON(t, call(t, "GET", base(addr)+"/v1/indexes/model-to-app/keys/model2"), 200, `{"index":"model-to-app","key":"model2","values":["base"]}`)
}

func base(addr string) string { return "http://" + addr }

// TestServeCustomCRD onboards the Gateway CRD with YAML only: serve
// installs the CRD listed under crds:, and answers lookups over nested
// arrays, a dotted label key, a number key and all namespaces.
func TestServeCustomCRD(t *testing.T) {
	testenv.Need(t, env)
	dir := filepath.Join(testenv.Root(), "examples", "custom-crd")
	body, err := os.ReadFile(filepath.Join(dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	cfg := strings.Replace(string(body), "listen: 127.0.0.1:8081", "listen: "+addr, 1)
	cfg = "crds: [" + filepath.Join(dir, "crd.yaml") + "]\n" + cfg
	config := filepath.Join(t.TempDir(), "config.yaml")
	_ = os.WriteFile(config, []byte(cfg), 0o600)

	d := start(t, nil, "--config", config, "--kubeconfig", env.WriteKubeconfig(t, ""))
	waitHTTP(t, d, addr)
	if err := kubeapply.Files(context.Background(), env.Config, filepath.Join(dir, "samples.yaml")); err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr
	get := func(index, key string) string {
		out, errOut, code := metasync(t, "get", "--server", base, index, key)
		if code != 0 {
			t.Fatalf("get %s %s: %s", index, key, errOut)
		}
		return strings.ReplaceAll(strings.TrimSpace(out), "\n", " ")
	}
	testenv.Eventually(t, "gateways indexed", func() string {
		if got := get("host-to-gateway", "api.example.com"); got != "edge-a/public edge-b/internal" {
			return got
		}
		return ""
	})
	for _, c := range []struct{ index, key, want string }{
		{"host-to-gateway", "www.shop.example.com", "edge-a/public"},
		{"tier-to-gateway", "frontline", "edge-a/public"},
		{"tier-to-gateway", "backoffice", "edge-b/internal"},
		{"priority-to-gateway", "20", "edge-b/internal"},
		{"namespaced-host-to-backend", "edge-b/api.example.com", "internal-api"},
		{"namespaced-host-to-backend", "edge-a/shop.example.com", "api-svc shop-svc"},
	} {
		if got := get(c.index, c.key); got != c.want {
			t.Errorf("%s %s = %q, want %q", c.index, c.key, got, c.want)
		}
	}
	if !strings.Contains(d.stderr.String(), `"msg":"CRDs installed and established"`) {
		t.Errorf("no CRD install in the logs")
	}
}

// TestTokenAuth: with --auth=tokenreview, no token is 401, a token without
// access is 403, a token whose account may get the path is 200, for 50
// keys of an index as for one; the review counters are in /metrics; probes
// stay open, /readyz?verbose gives no details without access. Beyond
// loopback, serve refuses to start without --auth.
func TestTokenAuth(t *testing.T) {
	testenv.Need(t, env)
	setupCluster(t)
	ns := "auth-test"
	env.Namespace(t, ns)
	rbac := fmt.Sprintf(`
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: %[1]s}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: nobody, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metasync-client-test}
rules:
- nonResourceURLs: ["/v1/*", "/metrics"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: metasync-client-test}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metasync-client-test}
subjects:
- {kind: ServiceAccount, name: reader, namespace: %[1]s}
`, ns)
	path := filepath.Join(t.TempDir(), "rbac.yaml")
	_ = os.WriteFile(path, []byte(rbac), 0o600)
	if err := kubeapply.Files(context.Background(), env.Config, path); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		tr, err := env.Kube.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	reader, nobody := token("reader"), token("nobody")

	addr := testenv.FreeAddr(t)
	d := start(t, nil, "--config", writeConfig(t, addr), "--kubeconfig", env.WriteKubeconfig(t, ""), "--auth", "tokenreview")
	waitHTTP(t, d, addr)
	get := func(path, tok string) answer {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return answer{code: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), raw: string(raw)}
	}
	url := "/v1/indexes/model-to-app/keys/model1"
	if a := get(url, ""); a.code != 401 || !strings.Contains(a.raw, "a bearer token is required") {
		t.Fatalf("no token: %d %s", a.code, a.raw)
	}
	if a := get(url, "not-a-token"); a.code != 401 {
		t.Fatalf("a bad token: %d %s", a.code, a.raw)
	}
	if a := get(url, nobody); a.code != 403 || !strings.Contains(a.raw, "system:serviceaccount:auth-test:nobody may not get") {
		t.Fatalf("a token without access: %d %s", a.code, a.raw)
	}
	testenv.Eventually(t, "the reader gets the answer", func() string {
		if a := get(url, reader); a.code != 200 || !strings.Contains(a.raw, `"values":["base"]`) {
			return fmt.Sprintf("%d %s", a.code, a.raw)
		}
		return ""
	})
	// 50 keys of one index: one decision for the index, not one per key.
	for i := range 50 {
		if a := get(fmt.Sprintf("/v1/indexes/model-to-app/keys/key-%d", i), reader); a.code != 200 {
			t.Fatalf("key %d: %d %s", i, a.code, a.raw)
		}
	}
	m := get("/metrics", reader)
	if m.code != 200 {
		t.Fatalf("/metrics with access: %d", m.code)
	}
	if !strings.Contains(m.raw, `metasync_auth_reviews_total{result="ok",review="token"}`) || !strings.Contains(m.raw, "metasync_auth_busy_total 0") {
		t.Errorf("/metrics lacks the review counters")
	}
	if a := get("/livez", ""); a.code != 200 {
		t.Fatalf("/livez without a token: %d", a.code)
	}
	// /readyz stays open; its details need a token allowed /readyz/verbose,
	// which access to /v1/* is not.
	for _, tok := range []string{"", reader} {
		a := get("/readyz?verbose", tok)
		if (a.code != 200 && a.code != 503) || strings.Contains(a.raw, `"resources"`) || !strings.Contains(a.raw, `"verbose":"details withheld: `) {
			t.Fatalf("/readyz?verbose without access: %d %s", a.code, a.raw)
		}
	}

	// Beyond loopback without --auth: refused, nothing started.
	_, errOut, code := metasync(t, "serve", "--config", writeConfig(t, "0.0.0.0:"+strings.Split(testenv.FreeAddr(t), ":")[1]), "--kubeconfig", env.WriteKubeconfig(t, ""))
	if code != 1 || !strings.Contains(errOut, "listening beyond loopback needs --auth=tokenreview") {
		t.Fatalf("beyond loopback without --auth: exit %d\n%s", code, errOut)
	}
}
