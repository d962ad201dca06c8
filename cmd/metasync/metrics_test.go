package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/test/testenv"
)

// samples reads the daemon's /metrics into sample -> value.
func samples(t *testing.T, base string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range strings.Split(call(t, "GET", base+"/metrics").raw, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// TestRelistLoopInMetrics: the real binary, whose account may list but not
// watch ConfigMaps, relists in a loop; /metrics shows it as a rate of lists
// of the resource and of 403 answers in client-go's request metrics, and
// the expression of the alert MetasyncRelistLoop (deploy/monitoring: a
// rate of lists above 0.05/s) holds on the scraped values.
func TestRelistLoopInMetrics(t *testing.T) {
	testenv.Need(t, env)
	const ns = "relist-metrics"
	env.Namespace(t, ns)
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "listed", Namespace: ns, Labels: map[string]string{"app": "app-1"}}}
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.ListOnlyRole(t, ns, "relist-user")
	kubeconfig, _ := env.UserKubeconfig(t, "relist-user")
	addr := testenv.FreeAddr(t)
	config := filepath.Join(t.TempDir(), "config.yaml")
	_ = os.WriteFile(config, []byte(fmt.Sprintf(`
server: {listen: "%s"}
resources:
  - {name: configmaps, version: v1, resource: configmaps, namespace: %s,
     indexes: [{name: cm-app, key: metadata.labels.app}]}
`, addr, ns)), 0o600)
	d := start(t, nil, "--config", config, "--kubeconfig", kubeconfig, "--stale-after", "5s")
	waitHTTP(t, d, addr)
	base := "http://" + addr

	const lists = `metasync_relists_total{resource="configmaps"}`
	forbidden := func(m map[string]float64) (n float64) {
		for k, v := range m {
			if strings.HasPrefix(k, "rest_client_requests_total{") && strings.Contains(k, `code="403"`) {
				n += v
			}
		}
		return n
	}
	first, at := samples(t, base), time.Now()
	time.Sleep(20 * time.Second)
	second, window := samples(t, base), time.Since(at).Seconds()
	rate := (second[lists] - first[lists]) / window
	refused := (forbidden(second) - forbidden(first)) / window
	t.Logf("over %.0fs: %.3f lists/s of the resource, %.3f refused requests/s", window, rate, refused)
	if rate <= 0.05 {
		t.Errorf("rate(%s) = %.3f/s: the alert MetasyncRelistLoop (> 0.05) would not fire", lists, rate)
	}
	if refused <= 0 {
		t.Errorf("no rise of rest_client_requests_total{code=\"403\"}")
	}
	if second[`metasync_resource_ready{resource="configmaps"}`] != 0 {
		t.Errorf("a resource that cannot watch is ready")
	}
}
