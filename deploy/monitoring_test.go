package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/iidp/metasync/test/testenv"
)

// ruleFile is the part of a PrometheusRule that Prometheus reads.
type ruleFile struct {
	Groups []struct {
		Name  string           `json:"name"`
		Rules []map[string]any `json:"rules"`
	} `json:"groups"`
}

func monitoringRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Kind string   `json:"kind"`
		Spec ruleFile `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &pr); err != nil {
		t.Fatal(err)
	}
	if pr.Kind != "PrometheusRule" || len(pr.Spec.Groups) == 0 {
		t.Fatalf("monitoring/prometheusrule.yaml: kind %q, %d groups", pr.Kind, len(pr.Spec.Groups))
	}
	return pr.Spec
}

// metricNames are the metric names an expression reads.
var metricName = regexp.MustCompile(`\b((?:metasync|rest_client|process|go|container|kube)_[a-z_]+)`)

// exported reports whether metasync exports a metric: its name (without a
// histogram's or summary's suffix) is a literal in the code that registers
// the daemon's metrics; process_, go_, container_ and kube_ metrics come
// from the Go and process collectors, the kubelet and kube-state-metrics.
func exported(t *testing.T) func(string) bool {
	t.Helper()
	var src strings.Builder
	for _, dir := range []string{"cmd/metasync", "cmd/metasync/internal/server", "cmd/metasync/internal/auth", "cmd/metasync/internal/xds", "cmd/metasync/internal/consul"} {
		files, _ := filepath.Glob(filepath.Join(testenv.Root(), dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, _ := os.ReadFile(f)
			src.Write(b)
		}
	}
	code := src.String()
	return func(name string) bool {
		for _, p := range []string{"process_", "go_", "container_", "kube_"} {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		for _, suffix := range []string{"_bucket", "_count", "_sum", ""} {
			if base, ok := strings.CutSuffix(name, suffix); ok && strings.Contains(code, `"`+base+`"`) {
				return true
			}
		}
		return false
	}
}

// TestAlertsAreComplete: every alert has a severity, a summary and a
// description that says what to do, and a duration; every metric it reads
// is one metasync exports.
func TestAlertsAreComplete(t *testing.T) {
	isExported := exported(t)
	n := 0
	for _, g := range monitoringRules(t).Groups {
		for _, r := range g.Rules {
			n++
			name, _ := r["alert"].(string)
			labels, _ := r["labels"].(map[string]any)
			ann, _ := r["annotations"].(map[string]any)
			if name == "" || labels["severity"] == nil || ann["summary"] == nil || ann["description"] == nil || r["for"] == nil {
				t.Errorf("rule %d of %s: want alert, for, labels.severity, annotations.summary and .description: %v", n, g.Name, r)
			}
			for _, m := range metricName.FindAllString(r["expr"].(string), -1) {
				if !isExported(m) {
					t.Errorf("alert %s reads %s, which metasync does not export", name, m)
				}
			}
		}
	}
	if n < 7 {
		t.Errorf("%d alerts", n)
	}
}

// dashboardExprs returns every query of the Grafana dashboard, its
// variables replaced by values Prometheus accepts.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("monitoring", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	out := map[string]string{}
	r := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*", "$instance", ".*")
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			out[p.Title+" #"+string(rune('A'+i))] = r.Replace(tg.Expr)
		}
	}
	return out
}

// TestDashboardReadsExportedMetrics: every query of the dashboard reads
// metrics that metasync exports.
func TestDashboardReadsExportedMetrics(t *testing.T) {
	isExported := exported(t)
	for title, expr := range dashboardExprs(t) {
		for _, m := range metricName.FindAllString(expr, -1) {
			if !isExported(m) {
				t.Errorf("panel %s reads %s, which metasync does not export", title, m)
			}
		}
	}
}

// TestAlertRules runs promtool (Prometheus's own parser and rule unit-test
// runner, built by hack/promtool.sh; make test sets PROMTOOL): the rules
// and every dashboard query parse, and monitoring/alerts_test.yaml, which
// fires each alert on series that should fire it and not on series that
// should not, passes. The unit tests read the rules without their
// annotations, which `promtool check rules` checks (templates included).
func TestAlertRules(t *testing.T) {
	promtool := os.Getenv("PROMTOOL")
	if promtool == "" {
		t.Skip("PROMTOOL is not set: run `make test`, or PROMTOOL=$(hack/promtool.sh) go test ./deploy")
	}
	rules := monitoringRules(t)
	dir := t.TempDir()
	write := func(name string, v any) string {
		t.Helper()
		b, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("check", "rules", write("full.yaml", rules))

	// The dashboard's queries, as recording rules: promtool parses them.
	var recorded []map[string]any
	for title, expr := range dashboardExprs(t) {
		_ = title
		recorded = append(recorded, map[string]any{"record": "dashboard:query", "expr": expr})
	}
	run("check", "rules", write("dashboard.yaml", map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": recorded}}}))

	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			delete(r, "annotations")
		}
	}
	write("rules.yaml", rules)
	tests, err := os.ReadFile(filepath.Join("monitoring", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644)
	run("test", "rules", "alerts_test.yaml")
}

// TestServiceMonitorScrapesTheService: monitoring/servicemonitor.yaml
// selects base's Service (labels, namespace, port) and verifies the
// serving certificate that cert-manager makes (name, CA Secret).
func TestServiceMonitorScrapesTheService(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("monitoring", "servicemonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var sm struct {
		Kind     string
		Metadata struct{ Namespace string }
		Spec     struct {
			Selector          struct{ MatchLabels map[string]string }
			NamespaceSelector struct{ MatchNames []string }
			Endpoints         []struct {
				Port, Scheme, Path string
				TLSConfig          struct {
					ServerName string
					CA         struct{ Secret struct{ Name, Key string } }
				}
			}
		}
	}
	if err := yaml.Unmarshal(b, &sm); err != nil {
		t.Fatal(err)
	}
	if sm.Kind != "ServiceMonitor" || len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("servicemonitor.yaml: kind %q, %d endpoints", sm.Kind, len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	var svc *unstructured.Unstructured
	for _, o := range render(t, "base") {
		if o.GetKind() == "Service" && o.GetName() == "metasync" {
			svc = o
		}
	}
	if svc == nil {
		t.Fatal("base has no Service metasync")
	}
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.GetLabels()[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s; the Service's labels are %v", k, v, svc.GetLabels())
		}
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{svc.GetNamespace()}) || sm.Metadata.Namespace != svc.GetNamespace() {
		t.Errorf("the ServiceMonitor looks in %v (and is in %s); the Service is in %s", sm.Spec.NamespaceSelector.MatchNames, sm.Metadata.Namespace, svc.GetNamespace())
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	found := false
	for _, p := range ports {
		if m, _ := p.(map[string]any); m["name"] == ep.Port {
			found = true
		}
	}
	if !found || ep.Scheme != "https" || ep.Path != "/metrics" {
		t.Errorf("endpoint %+v: the Service's ports are %v; want its port by name, https, /metrics", ep, ports)
	}
	var names []string
	caSecret := false
	for _, o := range render(t, "cert-manager") {
		if o.GetKind() != "Certificate" {
			continue
		}
		secret, _, _ := unstructured.NestedString(o.Object, "spec", "secretName")
		dns, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "dnsNames")
		names = append(names, dns...)
		if secret == ep.TLSConfig.CA.Secret.Name && o.GetNamespace() == svc.GetNamespace() {
			caSecret = true
		}
	}
	if !slices.Contains(names, ep.TLSConfig.ServerName) || !caSecret || ep.TLSConfig.CA.Secret.Key != "ca.crt" {
		t.Errorf("tlsConfig %+v: the certificates name %v; want one of them, and the CA Secret that cert-manager makes in %s", ep.TLSConfig, names, svc.GetNamespace())
	}
}
