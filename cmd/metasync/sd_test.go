package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/test/testenv"
)

// TestPrometheusHTTPSDOnTheControlPlane runs Prometheus (the prometheus
// binary on PATH) with an http_sd_configs job against
// /v1/sd/chains/model-to-endpoints, relabelling __meta_metasync_key to
// model, as docs/facades.md says: its /api/v1/targets lists a model's
// endpoints with the label, and follows an endpoint change. The answer
// itself: one target group per key, [] for an index with no host:port
// value, 404 for an unknown chain.
func TestPrometheusHTTPSDOnTheControlPlane(t *testing.T) {
	addr, _, backends, _ := consulDaemon(t, "sd-e2e", 2)
	var groups []struct {
		Targets []string
		Labels  map[string]string
	}
	testenv.Eventually(t, "the chain's target groups", func() string {
		a := getRaw(t, "GET", base(addr)+"/v1/sd/chains/model-to-endpoints")
		groups = nil
		if err := json.Unmarshal([]byte(a.raw), &groups); err != nil || a.code != 200 || len(groups) != 1 {
			return fmt.Sprint(a.code, a.raw)
		}
		return ""
	})
	slices.Sort(groups[0].Targets)
	if !slices.Equal(groups[0].Targets, slices.Sorted(slices.Values(backends))) ||
		groups[0].Labels["__meta_metasync_chain"] != "model-to-endpoints" || groups[0].Labels["__meta_metasync_key"] != "xds-model" {
		t.Errorf("target group %+v, want %v labelled with the chain and the key", groups[0], backends)
	}
	// model-to-app's values are app names, no host:port: no group.
	if a := getRaw(t, "GET", base(addr)+"/v1/sd/indexes/model-to-app"); a.code != 200 || strings.TrimSpace(a.raw) != "[]" {
		t.Errorf("an index without host:port values: %d %s, want []", a.code, a.raw)
	}
	if a := getRaw(t, "GET", base(addr)+"/v1/sd/chains/nope"); a.code != 404 || !strings.Contains(a.ctype, "json") {
		t.Errorf("unknown chain: %d %s %s", a.code, a.ctype, a.raw)
	}
	if a := getRaw(t, "POST", base(addr)+"/v1/sd/chains/model-to-endpoints"); a.code != 405 {
		t.Errorf("POST: %d %s", a.code, a.raw)
	}

	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("no prometheus on PATH (Debian: apt-get install prometheus): http_sd is not run on a real Prometheus")
	}
	dir := t.TempDir()
	// The job of examples/appmodel, which docs/facades.md shows, on the
	// daemon's address, refreshed every second.
	job, err := os.ReadFile(filepath.Join(testenv.Root(), "examples", "appmodel", "prometheus-http-sd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	promConfig := "global: {scrape_interval: 1s}\n" + strings.NewReplacer("127.0.0.1:8080", addr, "refresh_interval: 15s", "refresh_interval: 1s").Replace(string(job))
	if !strings.Contains(promConfig, addr) || !strings.Contains(promConfig, "refresh_interval: 1s") {
		t.Fatalf("the example job changed: %s", job)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(promConfig), 0o644); err != nil {
		t.Fatal(err)
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
	targets := func() []string {
		resp, err := http.Get("http://" + promAddr + "/api/v1/targets")
		if err != nil {
			return []string{"error " + err.Error()}
		}
		defer resp.Body.Close()
		var ans struct {
			Data struct {
				ActiveTargets []struct {
					Labels           map[string]string
					DiscoveredLabels map[string]string
				}
			}
		}
		_ = json.NewDecoder(resp.Body).Decode(&ans)
		var out []string
		for _, a := range ans.Data.ActiveTargets {
			out = append(out, a.Labels["instance"]+" model="+a.Labels["model"]+" key="+a.DiscoveredLabels["__meta_metasync_key"])
		}
		slices.Sort(out)
		return out
	}
	want := func(what string, addrs ...string) {
		t.Helper()
		var w []string
		for _, a := range addrs {
			w = append(w, a+" model=xds-model key=xds-model")
		}
		slices.Sort(w)
		start := time.Now()
		testenv.Eventually(t, what, func() string {
			if got := targets(); !slices.Equal(got, w) {
				return fmt.Sprintf("%v, want %v", got, w)
			}
			return ""
		})
		t.Logf("%s: after %v", what, time.Since(start).Round(time.Millisecond))
	}
	want("Prometheus lists the model's endpoints, labelled", backends...)
	if err := env.Kube.DiscoveryV1().EndpointSlices("sd-e2e").Delete(t.Context(), "xds-app-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("Prometheus follows the endpoint change", backends[0])
}

// getRaw is call for answers that are not a JSON object: their status,
// content type and body.
func getRaw(t *testing.T, method, url string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	return answer{code: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), raw: readAll(resp)}
}
