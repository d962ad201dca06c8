package main_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// TestExampleProgram runs the walk-through against the real control plane
// and checks what it prints.
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
	cmd := exec.Command(bin, "--kubeconfig", env.WriteKubeconfig(t, ""), "--config", filepath.Join(root, "examples", "appmodel", "config.yaml"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	t.Logf("output:\n%s", out)
	for _, want := range []string{
		"registered app iiot: models iiot_dataservice, iiot_edge_project, iiot_data_query (field manager iiot-registrar)\n",
		"another-team without force: conflict, nothing changed (",
		"model iiot_dataservice -> app iiot (type model, version 2.8.2)\n",
		"app iiot -> 10.0.3.10\n",
		"model model1 -> app base (type model, version 1.7)\n",
		"app base -> 10.0.0.5, 10.0.0.6, 10.0.1.7, 10.0.2.9\n",
		"chain model-to-addresses: model1 -> 10.0.0.5, 10.0.0.6, 10.0.1.7, 10.0.2.9\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
