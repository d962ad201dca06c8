package main_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// readmeSteps returns the lines of the first sh block of a README, without
// comment lines and blank lines.
func readmeSteps(t *testing.T, path string) []string {
	t.Helper()
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(body), "```sh\n")
	if !ok {
		t.Fatalf("%s: no ```sh block", path)
	}
	block, _, _ = strings.Cut(block, "```")
	var steps []string
	for _, line := range strings.Split(block, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			steps = append(steps, line)
		}
	}
	return steps
}

// crdCondition returns the status of a CRD's condition ("" when the CRD or
// the condition is missing).
func crdCondition(t *testing.T, name, condition string) string {
	t.Helper()
	u, err := env.Dynamic.Resource(crdResource).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if strings.EqualFold(m["type"].(string), condition) {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}

// TestCustomCRDReadme runs the steps of examples/custom-crd/README.md as
// written, on a control plane where the Gateway CRD is not installed (as on
// a fresh cluster), each kubectl command by its equivalent, each metasync
// command with the binary under test, and checks the answers that the
// README's comments give. Only the address differs: a free port instead of
// the README's 127.0.0.1:8081, which must not be `make run`'s.
// On HEAD the first step, `kubectl apply -f crd.yaml -f samples.yaml`,
// failed: the Gateway kind is not served until the CRD is established.
func TestCustomCRDReadme(t *testing.T) {
	testenv.Need(t, env)
	root := testenv.Root()
	dir := filepath.Join(root, "examples", "custom-crd")
	const crdName = "gateways.net.iidp.com"

	// The README's address: the config's, the one its commands ask, not
	// make run's.
	config, err := os.ReadFile(filepath.Join(dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const readmeAddr = "127.0.0.1:8081"
	if !strings.Contains(string(config), "listen: "+readmeAddr) {
		t.Fatalf("config.yaml does not listen on %s, the address of the README's commands", readmeAddr)
	}
	addr := testenv.FreeAddr(t)
	testConfig := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(testConfig, []byte(strings.Replace(string(config), "listen: "+readmeAddr, "listen: "+addr, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", env.WriteKubeconfig(t, ""))

	// A cluster without the CRD.
	ctx := context.Background()
	deleteCRD(t, ctx, crdName)

	var daemon *daemon
	path := func(p string) string {
		if p == "examples/custom-crd/config.yaml" {
			return testConfig
		}
		return filepath.Join(root, p)
	}
	steps := readmeSteps(t, filepath.Join(dir, "README.md"))
	if len(steps) == 0 {
		t.Fatal("the README has no steps")
	}
	for i, step := range steps {
		line, comment, _ := strings.Cut(step, " # ")
		line = strings.ReplaceAll(line, readmeAddr, addr)
		f := strings.Fields(line)
		switch {
		case len(f) > 2 && f[0] == "kubectl" && f[1] == "apply":
			readmeApply(t, ctx, i, step, f, path)
		case len(f) > 2 && f[0] == "kubectl" && f[1] == "wait":
			readmeWait(t, i, step, f)
		case len(f) > 2 && f[0] == "bin/metasync" && f[1] == "serve" && f[len(f)-1] == "&":
			args := f[2 : len(f)-1]
			for j := range args {
				if j > 0 && args[j-1] == "--config" {
					args[j] = path(args[j])
				}
			}
			daemon = start(t, nil, args...)
		case len(f) > 1 && f[0] == "bin/metasync":
			args := f[1:]
			for j := range args {
				if j > 0 && args[j-1] == "--config" {
					args[j] = path(args[j])
				}
			}
			out, errOut, code := metasync(t, args...)
			if code != 0 {
				t.Fatalf("step %d %q: exit %d\n%s%s", i+1, step, code, out, errOut)
			}
			if args[0] == "get" {
				want := strings.Join(strings.Split(strings.TrimSpace(comment), ", "), "\n") + "\n"
				if out != want {
					t.Errorf("step %d %q printed %q, want %q (the README's comment)", i+1, step, out, want)
				}
			}
		case strings.HasPrefix(line, "until curl -sf "):
			url := f[3]
			if daemon == nil {
				t.Fatalf("step %d %q: no daemon started", i+1, step)
			}
			testenv.Eventually(t, "step "+step, func() string {
				select {
				case <-daemon.done:
					t.Fatalf("metasync serve exited: %v\n%s", daemon.err, daemon.stderr)
				default:
				}
				resp, err := http.Get(url)
				if err != nil {
					return err.Error()
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return resp.Status
				}
				return ""
			})
		case line == "kill %1":
			if daemon == nil {
				t.Fatalf("step %d %q: no daemon started", i+1, step)
			}
			_ = daemon.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-daemon.done:
				if daemon.err != nil {
					t.Errorf("step %d %q: metasync serve ended with %v", i+1, step, daemon.err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("step %d %q: metasync serve still runs", i+1, step)
			}
		default:
			t.Fatalf("step %d %q: the test does not know how to run it; teach it", i+1, step)
		}
	}
}

// deleteCRD deletes the CRD name, if installed, and waits until it is
// gone.
func deleteCRD(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	err := env.Dynamic.Resource(crdResource).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	testenv.Eventually(t, "no CRD "+name, func() string {
		if _, err := env.Dynamic.Resource(crdResource).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return "still there"
		}
		return ""
	})
}

// readmeApply runs step i of the README, kubectl apply of its fields f
// (only -f FILE, each file where path puts it), within 30 s.
func readmeApply(t *testing.T, ctx context.Context, i int, step string, f []string, path func(string) string) {
	var files []string
	for j := 2; j < len(f); j++ {
		if f[j] != "-f" || j+1 == len(f) {
			t.Fatalf("step %d %q: only -f FILE is understood", i+1, step)
		}
		files = append(files, path(f[j+1]))
		j++
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := kubeapply.Files(actx, env.Config, files...)
	cancel()
	if err != nil {
		t.Fatalf("step %d %q: %v", i+1, step, err)
	}
}

// readmeWait runs step i of the README, kubectl wait of its fields f (only
// --for condition=C crd/NAME, and --timeout, 30 s if not given).
func readmeWait(t *testing.T, i int, step string, f []string) {
	var cond, target string
	timeout := 30 * time.Second
	for j := 2; j < len(f); j++ {
		switch a := f[j]; {
		case a == "--for" && j+1 < len(f):
			cond, j = f[j+1], j+1
		case strings.HasPrefix(a, "--for="):
			cond = strings.TrimPrefix(a, "--for=")
		case strings.HasPrefix(a, "--timeout="):
			var err error
			if timeout, err = time.ParseDuration(strings.TrimPrefix(a, "--timeout=")); err != nil {
				t.Fatalf("step %d %q: %v", i+1, step, err)
			}
		case !strings.HasPrefix(a, "-"):
			target = a
		default:
			t.Fatalf("step %d %q: %s is not understood", i+1, step, a)
		}
	}
	name, ok := strings.CutPrefix(target, "crd/")
	condition, ok2 := strings.CutPrefix(cond, "condition=")
	if !ok || !ok2 {
		t.Fatalf("step %d %q: only --for condition=C crd/NAME is understood", i+1, step)
	}
	for deadline := time.Now().Add(timeout); crdCondition(t, name, condition) != "True"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("step %d %q: timed out", i+1, step)
		}
	}
}
