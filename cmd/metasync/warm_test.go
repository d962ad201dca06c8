package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/iidp/metasync/test/testenv"
)

// TestWarmStartDaemon stops `metasync serve --snapshot-dir`, changes the
// cluster, and starts it again while the apiserver cannot be reached: it
// answers from the snapshot at once, every answer and stream frame marked
// stale, /readyz 503 with the reason; once the apiserver is back, the
// answers are the cluster's (the changes made while it was down
// included), unmarked, and /readyz is 200.
func TestWarmStartDaemon(t *testing.T) {
	testenv.Need(t, env)
	setupCluster(t)
	env.InstallCRD(t, lateCRD)
	applyWidget(t, "odd", map[string]any{"r": 255}) // fails widget-color's rule
	ctx := context.Background()
	apiAddr, addr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	target := strings.TrimSuffix(strings.TrimPrefix(env.Config.Host, "https://"), "/")
	proxy, err := testenv.NewProxy(apiAddr, target)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { proxy.Close() }()
	config, kubeconfig := writeConfig(t, addr), env.WriteKubeconfig(t, apiAddr)
	snapDir := filepath.Join(t.TempDir(), "snapshots") // serve makes it
	args := []string{"--config", config, "--kubeconfig", kubeconfig, "--stale-after", "1s"}

	d := start(t, []string{"METASYNC_SNAPSHOT_DIR=" + snapDir}, args...)
	waitHTTP(t, d, addr)
	testenv.Eventually(t, "ready", func() string {
		if a := call(t, "GET", base(addr)+"/readyz"); a.code != 200 {
			return a.raw
		}
		return ""
	})
	wantJSON(t, call(t, "GET", base(addr)+"/v1/chains/model-to-addresses/keys/model1"), 200,
		`{"chain":"model-to-addresses","key":"model1","values":["10.0.0.5","10.0.0.6"]}`)
	if got := metric(t, base(addr), `metasync_snapshot_loads_total{outcome="cold",reason="missing"}`); got != "1" {
		t.Errorf("first start: cold load metric %q", got)
	}
	if log := d.stderr.String(); !strings.Contains(log, `"level":"INFO","msg":"no snapshot yet: cold start`) || strings.Contains(log, `"level":"WARN","msg":"no snapshot`) || strings.Contains(log, `"level":"WARN","msg":"snapshot ignored`) {
		t.Errorf("a first start with --snapshot-dir logs a warning, or not the cold start at INFO:\n%s", log)
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.done
	if d.err != nil {
		t.Fatalf("serve exited with %v", d.err)
	}
	if !strings.Contains(d.stderr.String(), `"msg":"snapshot written"`) {
		t.Errorf("no snapshot written at shutdown:\n%s", d.stderr)
	}

	warmChangeWhileDown(t, ctx)
	proxy.Close() // and the apiserver cannot be reached

	started := time.Now()
	// No heartbeat in the test's time: a stream hears that the daemon
	// caught up from the catch-up itself.
	d = start(t, []string{"METASYNC_SNAPSHOT_DIR=" + snapDir}, append(args, "--stream-heartbeat", "1h")...)
	waitHTTP(t, d, addr)
	t.Logf("answering %v after the start", time.Since(started).Round(time.Millisecond))
	s := warmStaleAnswers(t, addr)

	proxy, err = testenv.NewProxy(apiAddr, target)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "ready once the apiserver is back", func() string {
		if a := call(t, "GET", base(addr)+"/readyz?verbose"); a.code != 200 {
			return a.raw
		}
		return ""
	})
	wantJSON(t, call(t, "GET", base(addr)+"/v1/chains/model-to-addresses/keys/model1"), 200,
		`{"chain":"model-to-addresses","key":"model1","values":["10.0.0.5"]}`)
	wantJSON(t, call(t, "GET", base(addr)+"/v1/indexes/model-to-app/keys/warm-model"), 200,
		`{"index":"model-to-app","key":"warm-model","values":["warm"]}`)
	// The widget that fails its rule is not in the snapshot's data: its
	// resource lists at the warm start, and finds it failing again.
	testenv.Eventually(t, "the failing widget counted after the warm start", func() string {
		if got := metric(t, base(addr), `metasync_rule_failing_objects{index="widget-color",resource="widgets"}`); got != "1" {
			return "metasync_rule_failing_objects " + got
		}
		return ""
	})
	testenv.Eventually(t, "the stream hears that the daemon caught up", func() string {
		s.mu.Lock()
		defer s.mu.Unlock()
		if last := s.frames[len(s.frames)-1]; last["type"] == "heartbeat" && last["stale"] == nil {
			return ""
		}
		return fmt.Sprint(s.frames)
	})
	if got := metric(t, base(addr), `metasync_relists_total{resource="appmodels"}`); got != "0" {
		t.Errorf("%s relists of appmodels: the watch should have resumed", got)
	}
	if fi, err := os.Stat(filepath.Join(snapDir, "snapshot")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("snapshot file: %v %v", fi, err)
	}
}

// warmChangeWhileDown: while the daemon is down, an AppModel appears (warm,
// of warm-model) and a slice goes (base-b).
func warmChangeWhileDown(t *testing.T, ctx context.Context) {
	app := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "iidp.com/v1", "kind": "AppModel",
		"metadata": map[string]any{"name": "warm", "labels": map[string]any{"iidp": "iidp"}},
		"spec":     map[string]any{"type": "model", "version": "1", "models": []any{"warm-model"}},
	}}
	if _, err := env.Dynamic.Resource(appModelsGVR).Namespace("e2e").Apply(ctx, "warm", app, metav1.ApplyOptions{FieldManager: "e2e", Force: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Dynamic.Resource(appModelsGVR).Namespace("e2e").Delete(ctx, "warm", metav1.DeleteOptions{})
	})
	if err := env.Kube.DiscoveryV1().EndpointSlices("e2e").Delete(ctx, "base-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// warmStaleAnswers: the daemon at addr, warm started while the apiserver
// cannot be reached, answers from its snapshot, every answer and the
// snapshot frame of a stream marked stale, /readyz 503 with the reason. It
// returns that stream, on model2.
func warmStaleAnswers(t *testing.T, addr string) *stream {
	a := call(t, "GET", base(addr)+"/v1/chains/model-to-addresses/keys/model1")
	wantJSON(t, a, 200, `{"chain":"model-to-addresses","key":"model1","values":["10.0.0.5","10.0.0.6"],"stale":true}`)
	wantJSON(t, call(t, "GET", base(addr)+"/v1/indexes/model-to-app/keys/model2"), 200,
		`{"index":"model-to-app","key":"model2","values":["base"],"stale":true}`)
	s := follow(t, base(addr)+"/v1/indexes/model-to-app/keys/model2?watch=true")
	testenv.Eventually(t, "a stale snapshot frame", func() string {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.frames) > 0 && s.frames[0]["type"] == "snapshot" && s.frames[0]["stale"] == true {
			return ""
		}
		return "no stale snapshot frame yet"
	})
	r := call(t, "GET", base(addr)+"/readyz?verbose")
	if r.code != 503 || !strings.Contains(r.raw, "stale: answering from a snapshot") {
		t.Errorf("readyz while stale: %d %s", r.code, r.raw)
	}
	if got := metric(t, base(addr), `metasync_snapshot_loads_total{outcome="warm",reason=""}`); got != "1" {
		t.Errorf("warm load metric %q", got)
	}
	if got := metric(t, base(addr), `metasync_resource_stale{resource="appmodels"}`); got != "1" {
		t.Errorf("metasync_resource_stale %q while stale", got)
	}
	return s
}

var appModelsGVR = k8sschema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}
