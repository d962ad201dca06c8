package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/iidp/metasync/test/testenv"
)

var widgetsGVR = k8sschema.GroupVersionResource{Group: "late.iidp.com", Version: "v1", Resource: "widgets"}

// applyWidget writes the Widget name with spec.color color (any JSON
// value: the widget-color rule wants a string).
func applyWidget(t *testing.T, name string, color any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "late.iidp.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name, "namespace": "e2e"},
		"spec":     map[string]any{"color": color},
	}}
	if _, err := env.Dynamic.Resource(widgetsGVR).Namespace("e2e").Apply(context.Background(), name, u, metav1.ApplyOptions{FieldManager: "e2e", Force: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Dynamic.Resource(widgetsGVR).Namespace("e2e").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// TestDaemonAnswersObjectsAndChains: on a real control plane, the daemon
// answers what the library reads (an object's fields, the objects behind
// a key, the chains), the CLI prints them, and the objects whose rule
// fails now are counted and named per index, until they are fixed.
func TestDaemonAnswersObjectsAndChains(t *testing.T) {
	testenv.Need(t, env)
	setupCluster(t)
	env.InstallCRD(t, lateCRD)
	applyWidget(t, "odd", map[string]any{"r": 255}) // an object where the rule wants a string
	addr := testenv.FreeAddr(t)
	d := start(t, nil, "--config", writeConfig(t, addr), "--kubeconfig", env.WriteKubeconfig(t, ""))
	waitHTTP(t, d, addr)
	testenv.Eventually(t, "ready", func() string {
		if a := call(t, "GET", base(addr)+"/readyz"); a.code != 200 {
			return a.raw
		}
		return ""
	})
	const fields = `{"models":["model1","model2","model3"],"type":"model","version":"1.7"}`
	for path, want := range map[string]string{
		"/v1/chains": `{"chains":[{"name":"model-to-addresses","indexes":["model-to-app","service-to-addresses"],"synced":true}]}`,
		"/v1/resources/appmodels/objects/e2e%2Fbase":   `{"resource":"appmodels","key":"e2e/base","fields":` + fields + `}`,
		"/v1/indexes/model-to-app/keys/model1/objects": `{"index":"model-to-app","key":"model1","objects":[{"key":"e2e/base","fields":` + fields + `}]}`,
		"/v1/indexes/model-to-app/keys/nobody/objects": `{"index":"model-to-app","key":"nobody","objects":[]}`,
	} {
		wantJSON(t, call(t, "GET", base(addr)+path), 200, want)
	}
	for path, want := range map[string]string{
		"/v1/resources/appmodels/objects/e2e%2Fnope": `resource appmodels has no object \"e2e/nope\"`,
		"/v1/chains/model-to-addresses/keys":         `GET /v1/indexes/model-to-app/keys`,
		"/v1/resources/widgets/objects/e2e%2Fodd":    "declares no fields",
	} {
		a := call(t, "GET", base(addr)+path)
		if a.code != 404 || a.ctype != "application/json" || !strings.Contains(a.raw, want) {
			t.Errorf("GET %s = %d %q %s, want a JSON 404 with %s", path, a.code, a.ctype, a.raw, want)
		}
	}

	// The CLI, with the server as HOST:PORT and flags after the arguments.
	if out, errOut, code := metasync(t, "get", "--resource", "appmodels", "e2e/base", "--server", addr); code != 0 || out != `{"key":"e2e/base","fields":`+fields+"}\n" {
		t.Errorf("get --resource = exit %d %q %q", code, out, errOut)
	}
	if out, errOut, code := metasync(t, "get", "--objects", "model-to-app", "model2", "--server", addr); code != 0 || out != `{"key":"e2e/base","fields":`+fields+"}\n" {
		t.Errorf("get --objects = exit %d %q %q", code, out, errOut)
	}

	// The widget whose color is an object fails its rule: counted and
	// named, in /v1/indexes, /readyz?verbose, the metric and the CLI.
	failing := func() string {
		var ans struct {
			Indexes []struct {
				Name          string
				Failing       int
				LastRuleError *struct{ Object, Error string }
			}
		}
		a := call(t, "GET", base(addr)+"/v1/indexes")
		if err := json.Unmarshal([]byte(a.raw), &ans); err != nil {
			t.Fatal(err)
		}
		for _, ix := range ans.Indexes {
			if ix.Name == "widget-color" {
				if ix.LastRuleError != nil {
					return fmt.Sprintf("%d %s", ix.Failing, ix.LastRuleError.Object)
				}
				return fmt.Sprint(ix.Failing)
			}
		}
		return "no widget-color"
	}
	if got := failing(); got != "1 e2e/odd" {
		t.Errorf("widget-color failing = %s, want 1 e2e/odd", got)
	}
	if got := metric(t, base(addr), `metasync_rule_failing_objects{index="widget-color",resource="widgets"}`); got != "1" {
		t.Errorf("metasync_rule_failing_objects = %q, want 1", got)
	}
	if r := call(t, "GET", base(addr)+"/readyz?verbose"); !strings.Contains(r.raw, `{"name":"widget-color","failing":1,"lastRuleError":{"object":"e2e/odd","error":"`) {
		t.Errorf("readyz?verbose does not name the failing widget: %s", r.raw)
	}
	out, errOut, code := metasync(t, "indexes", "--server", base(addr))
	for _, want := range []string{
		"widget-color          widgets         0     true    false  1        -\n",
		"model-to-addresses  model-to-app -> service-to-addresses  true\n",
		"  widget-color: 1 object(s); last e2e/odd at ",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("indexes = exit %d\n%s%s\nwant a line %q", code, out, errOut, want)
		}
	}
	applyWidget(t, "odd", "red")
	testenv.Eventually(t, "the fixed widget fails no more", func() string {
		if got := failing(); got != "0" {
			return got
		}
		return ""
	})
	wantJSON(t, call(t, "GET", base(addr)+"/v1/indexes/widget-color/keys/red"), 200, `{"index":"widget-color","key":"red","values":["e2e/odd"]}`)
}

// TestAlertsOnARealPrometheus runs Prometheus (the prometheus binary on
// PATH) scraping the daemon every second with deploy/monitoring's rules,
// and checks that each alert goes pending in its fault: a rule that fails
// for an object from the start (MetasyncRuleFailing), a refused config
// reload (MetasyncConfigReloadFailed), an apiserver that answers nothing
// (MetasyncResourceNotReady).
func TestAlertsOnARealPrometheus(t *testing.T) {
	testenv.Need(t, env)
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("no prometheus on PATH (Debian: apt-get install prometheus): the alerts are not run on a real Prometheus")
	}
	setupCluster(t)
	env.InstallCRD(t, lateCRD)
	applyWidget(t, "odd", map[string]any{"r": 255}) // widget-color wants a string

	target := strings.TrimSuffix(strings.TrimPrefix(env.Config.Host, "https://"), "/")
	apiAddr, addr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	proxy, err := testenv.NewProxy(apiAddr, target)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	config := writeConfig(t, addr)
	d := start(t, nil, "--config", config, "--kubeconfig", env.WriteKubeconfig(t, apiAddr), "--stale-after", "1s")
	waitHTTP(t, d, addr)

	// Prometheus, with the PrometheusRule's groups as its rule file.
	dir := t.TempDir()
	rules := promRuleFile(t)
	promConfig := fmt.Sprintf(`
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [rules.yaml]
scrape_configs:
- job_name: metasync
  static_configs: [{targets: [%q]}]
`, addr)
	for name, body := range map[string][]byte{"rules.yaml": rules, "prometheus.yml": []byte(promConfig)} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	promAddr := testenv.FreeAddr(t)
	promLog := &testenv.Buffer{}
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--storage.tsdb.retention.time=1h")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, promLog, promLog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus:\n%s", promLog)
		}
	})
	alerts := func() map[string]string { return promAlerts(promAddr) }
	want := func(what string, names ...string) {
		t.Helper()
		deadline := 3 * time.Minute
		start := time.Now()
		for {
			got := alerts()
			missing := []string{}
			for _, n := range names {
				if got[n] != "pending" && got[n] != "firing" {
					missing = append(missing, n)
				}
			}
			if len(missing) == 0 {
				t.Logf("%s: pending after %v", what, time.Since(start).Round(time.Second))
				return
			}
			if time.Since(start) > deadline {
				t.Fatalf("%s: %v not pending after %v; alerts: %v", what, missing, deadline, got)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	want("a rule failing from the start", "MetasyncRuleFailing widgetswidget-color")
	if got := alerts(); len(got) != 1 {
		t.Errorf("alerts of a healthy daemon with one failing rule: %v", got)
	}

	// A refused reload, and an apiserver that takes connections and
	// answers nothing.
	if err := os.WriteFile(config, []byte("resources: [{name: x}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	proxy.BlackHole(true)
	want("a refused reload", "MetasyncConfigReloadFailed ")
	want("a black-holed apiserver", "MetasyncResourceNotReady appmodels")
}

// promRuleFile is the rule file of deploy/monitoring's PrometheusRule: its
// groups, each evaluated every second.
func promRuleFile(t *testing.T) []byte {
	t.Helper()
	rule, err := os.ReadFile(filepath.Join(testenv.Root(), "deploy", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Spec struct {
			Groups []map[string]any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(rule, &pr); err != nil {
		t.Fatal(err)
	}
	for _, g := range pr.Spec.Groups {
		g["interval"] = "1s"
	}
	rules, _ := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	return rules
}

// promAlerts is the state of each alert of the Prometheus at promAddr, by
// alert name, a space, and its resource or index; under "error" when it
// cannot be asked.
func promAlerts(promAddr string) map[string]string {
	resp, err := http.Get("http://" + promAddr + "/api/v1/alerts")
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	defer resp.Body.Close()
	var ans struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string
				State  string
			}
		}
	}
	_ = json.NewDecoder(resp.Body).Decode(&ans)
	out := map[string]string{}
	for _, a := range ans.Data.Alerts {
		out[a.Labels["alertname"]+" "+a.Labels["resource"]+a.Labels["index"]] = a.State
	}
	return out
}
