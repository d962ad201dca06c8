package main_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainLeakChecked(m, &env) }

// TestExampleProgram runs the walk-through against the real control plane
// and checks what it prints: with the reference config, then over all
// namespaces with apps whose names and object keys sort in different
// orders, where each app must still be shown with its own fields.
func TestExampleProgram(t *testing.T) {
	testenv.Need(t, env)
	root := testenv.Root()
	env.InstallCRDFile(t, filepath.Join(root, "examples", "appmodel", "crd.yaml"))
	if err := kubeapply.Files(context.Background(), env.Config,
		filepath.Join(root, "examples", "appmodel", "samples.yaml"),
		filepath.Join(root, "examples", "appmodel", "routing.yaml")); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "appmodel")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	kubeconfig := env.WriteKubeconfig(t, "")
	config := filepath.Join(root, "examples", "appmodel", "config.yaml")
	out := run(t, bin, "--kubeconfig", kubeconfig, "--config", config)
	for _, want := range []string{
		"registered app iiot: models iiot_dataservice, iiot_edge_project, iiot_data_query (field manager iiot-registrar)\n",
		"another-team without force: conflict, nothing changed (",
		"model iiot_dataservice -> app iiot (type model, version 2.8.2)\n",
		"app iiot -> 10.0.3.10\n",
		"model model1 -> app base (type model, version 1.7)\n",
		"app base -> 10.0.0.5, 10.0.0.6, 10.0.1.7, 10.0.2.9\n",
		"chain model-to-addresses: model1 -> 10.0.0.5, 10.0.0.6, 10.0.1.7, 10.0.2.9\n",
		"follow: iiot_dataservice -> 10.0.3.10\n",
		"a pod of iiot is ready: iiot_dataservice -> 10.0.3.10, 10.0.99.1\n",
		"the pod of iiot is gone: iiot_dataservice -> 10.0.3.10\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// Each app is shown with its own fields even where the order of the
	// apps' names (Lookup) differs from the order of their object keys
	// (Objects): the same config over all namespaces, and two apps of
	// model shared_model whose names sort one way and whose namespaces
	// sort the other.
	body, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	allNamespaces := strings.Replace(string(body), "    namespace: meta-test\n", "", 1)
	if allNamespaces == string(body) {
		t.Fatal("config.yaml has no namespace to drop")
	}
	// Both apps answer only when model-to-app is not unique (unique, the
	// oldest would: see docs/config.md).
	shared := strings.Replace(allNamespaces, "        unique: true\n", "", 1)
	if shared == allNamespaces {
		t.Fatal("config.yaml's model-to-app is not unique")
	}
	allNamespaces = shared
	config = filepath.Join(t.TempDir(), "config.yaml")
	pairing := filepath.Join(t.TempDir(), "pairing.yaml")
	if err := os.WriteFile(config, []byte(allNamespaces), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pairing, []byte(pairingObjects), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := kubeapply.Files(context.Background(), env.Config, pairing); err != nil {
		t.Fatal(err)
	}
	out = run(t, bin, "--kubeconfig", kubeconfig, "--config", config, "--models", "shared_model,model1")
	for _, want := range []string{
		"model shared_model -> app alpha (type model, version 2.0)\n",
		"model shared_model -> app zeta (type model, version 1.0)\n",
		"model model1 -> app base (type model, version 1.7)\n",
		"app base -> 10.0.0.5, 10.0.0.6, 10.0.1.7, 10.0.2.9\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// pairingObjects: app zeta in namespace pair-a and app alpha in pair-b
// both serve shared_model, with versions of their own. By name alpha comes
// first, by object key (pair-a/zeta, pair-b/alpha) zeta does.
const pairingObjects = `
apiVersion: v1
kind: Namespace
metadata: {name: pair-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: pair-b}
---
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: zeta, namespace: pair-a, labels: {iidp: iidp}}
spec: {type: model, version: "1.0", models: [shared_model]}
---
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: alpha, namespace: pair-b, labels: {iidp: iidp}}
spec: {type: model, version: "2.0", models: [shared_model]}
`

// run runs the built example with args and returns what it printed.
func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("run %q: %v\n%s", args, err, out)
	}
	t.Logf("output of %q:\n%s", args, out)
	return string(out)
}
