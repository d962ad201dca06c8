package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// followCLI runs `metasync get --watch ARGS` until the test ends, then
// interrupts it (it must exit 0); lines returns what it printed so far,
// one answer per line.
func followCLI(t *testing.T, args ...string) (lines func() []string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"get", "--watch"}, args...)...)
	var out, errOut testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("get --watch ended with %v after Ctrl-C: %s", err, errOut.String())
		}
	})
	return func() []string {
		s := strings.TrimSpace(out.String())
		if s == "" {
			return nil
		}
		return strings.Split(s, "\n")
	}
}

// TestWatchChainOnTheControlPlane: `metasync get --watch --chain` against
// a daemon on a real control plane sees a model's first addresses, then
// each change: an EndpointSlice gains or loses a ready endpoint, the
// AppModel drops the model, another app claims it, and after the deletes
// the answer is [].
func TestWatchChainOnTheControlPlane(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "watch-e2e"
	env.Namespace(t, ns)
	addr := testenv.FreeAddr(t)
	config := filepath.Join(t.TempDir(), "config.yaml")
	example, err := os.ReadFile(filepath.Join(testenv.Root(), "examples", "appmodel", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.ReplaceAll(string(example), "namespace: meta-test", "namespace: "+ns)
	cfg = strings.Replace(cfg, "listen: 127.0.0.1:8080", "listen: "+addr, 1)
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	apply := func(manifest string) {
		t.Helper()
		var objs []*unstructured.Unstructured
		for _, doc := range strings.Split(manifest, "---") {
			var m map[string]any
			if err := json.Unmarshal([]byte(doc), &m); err != nil {
				t.Fatalf("%v: %s", err, doc)
			}
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
		if err := kubeapply.Apply(ctx, env.Config, objs...); err != nil {
			t.Fatal(err)
		}
	}
	app := func(name string, models ...string) string {
		ms, _ := json.Marshal(models)
		return fmt.Sprintf(`{"apiVersion":"iidp.com/v1","kind":"AppModel","metadata":{"name":%q,"namespace":%q,"labels":{"iidp":"iidp"}},"spec":{"type":"model","version":"1","models":%s}}`, name, ns, ms)
	}
	slice := func(name, service string, endpoints ...string) string { // "10.0.0.5" ready, "-10.0.0.5" not
		var eps []string
		for _, e := range endpoints {
			ready := !strings.HasPrefix(e, "-")
			eps = append(eps, fmt.Sprintf(`{"addresses":[%q],"conditions":{"ready":%t}}`, strings.TrimPrefix(e, "-"), ready))
		}
		return fmt.Sprintf(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":%q,"namespace":%q,"labels":{"kubernetes.io/service-name":%q}},"addressType":"IPv4","endpoints":[%s]}`,
			name, ns, service, strings.Join(eps, ","))
	}
	apply(app("base", "model1") + "---" + slice("base-1", "base", "10.0.0.5"))

	d := start(t, nil, "--config", config, "--kubeconfig", env.WriteKubeconfig(t, ""), "--stream-heartbeat", "1s")
	waitHTTP(t, d, addr)
	lines := followCLI(t, "--server", "http://"+addr, "--chain", "model-to-addresses", "model1")

	var want []string
	expect := func(typ string, values ...string) {
		t.Helper()
		vs, _ := json.Marshal(append([]string{}, values...))
		want = append(want, fmt.Sprintf(`"type":%q,"chain":"model-to-addresses","key":"model1","values":%s`, typ, vs))
		testenv.Eventually(t, fmt.Sprintf("answer %d: %s", len(want), want[len(want)-1]), func() string {
			got := lines()
			if len(got) < len(want) {
				return fmt.Sprintf("%d lines: %q", len(got), got)
			}
			for i, w := range want {
				if !strings.Contains(got[i], w) {
					return fmt.Sprintf("line %d is %s, want %s", i, got[i], w)
				}
			}
			return ""
		})
	}
	expect("snapshot", "10.0.0.5")
	apply(slice("base-1", "base", "10.0.0.5", "10.0.0.6")) // gains a ready endpoint
	expect("update", "10.0.0.5", "10.0.0.6")
	apply(slice("base-1", "base", "-10.0.0.5", "10.0.0.6")) // one is not ready any more
	expect("update", "10.0.0.6")
	// Another app claims the model: model-to-app is unique, base (older,
	// or first by name) still answers, and the stream hears nothing.
	apply(app("other", "model1") + "---" + slice("other-1", "other", "10.0.1.1"))
	apply(app("base", "model2")) // base drops it: other answers, one update
	expect("update", "10.0.1.1")
	apply(slice("base-1", "base", "10.0.0.9")) // base is off the chain's path now: nothing
	dyn := dynamic.NewForConfigOrDie(env.Config)
	appModels := dyn.Resource(schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}).Namespace(ns)
	if err := appModels.Delete(ctx, "other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("update")
	if err := env.Kube.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "other-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a heartbeat's time: nothing more is printed
	if got := lines(); len(got) != len(want) {
		t.Fatalf("printed %d answers, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
}
