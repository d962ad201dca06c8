package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainLeakChecked(m, &env) }

// install applies the AppModel example: its CRD, AppModels and routing.
func install(t *testing.T) {
	t.Helper()
	dir := filepath.Join(testenv.Root(), "examples", "appmodel")
	env.InstallCRDFile(t, filepath.Join(dir, "crd.yaml"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, filepath.Join(dir, "samples.yaml"), filepath.Join(dir, "routing.yaml")); err != nil {
		t.Fatal(err)
	}
}

// waitOutput waits until out holds every line of want.
func waitOutput(t *testing.T, out *testenv.Buffer, exited <-chan struct{}, want ...string) {
	t.Helper()
	testenv.Eventually(t, "the program's answers", func() string {
		select {
		case <-exited:
			t.Fatalf("the program ended early; it printed:\n%s", out)
		default:
		}
		for _, w := range want {
			if !strings.Contains(out.String(), w) {
				return "no " + strings.TrimSpace(w) + " in:\n" + out.String()
			}
		}
		return ""
	})
}

// TestRun runs the program's logic in this process (with -race, under the
// race detector) on the real control plane, the kubeconfig given by
// --kubeconfig: it syncs, prints the lookup, the chain and the typed
// fields, keeps watching, and returns nil once its context ends.
func TestRun(t *testing.T) {
	testenv.Need(t, env)
	install(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &testenv.Buffer{}
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = run(ctx, []string{
			"--kubeconfig", env.WriteKubeconfig(t, ""),
			"--config", filepath.Join(testenv.Root(), "examples", "appmodel", "config.yaml"),
			"--model", "model1",
		}, out)
	}()
	waitOutput(t, out, done,
		"model model1: apps base; addresses 10.0.0.5, 10.0.0.6, 10.0.1.7, 10.0.2.9\n",
		"model model1: AppModel type model, version 1.7, models model1, model2, model3\n")
	select {
	case <-done:
		t.Fatalf("run returned before its context ended: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return 10s after its context ended")
	}
	if err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestProgram builds the program and runs it as a user would: from the
// repository's root with its default flags, the cluster found through
// KUBECONFIG (HOME holds no kubeconfig). It prints the answers for the
// default model, then exits 0 on SIGINT.
func TestProgram(t *testing.T) {
	testenv.Need(t, env)
	install(t)
	bin := filepath.Join(t.TempDir(), "library")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, stderr := &testenv.Buffer{}, &testenv.Buffer{}
	cmd := exec.Command(bin)
	cmd.Dir = testenv.Root()
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.WriteKubeconfig(t, ""), "HOME="+t.TempDir())
	cmd.Stdout, cmd.Stderr = out, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var err error
	go func() { err = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", out, stderr)
		}
	})
	waitOutput(t, out, exited,
		"model iiot_dataservice: apps iiot; addresses 10.0.3.10\n",
		"model iiot_dataservice: AppModel type model, version 2.8.2, models iiot_dataservice, iiot_edge_project, iiot_data_query\n")
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the program did not exit 10s after SIGINT")
	}
	if err != nil {
		t.Fatalf("the program exited with %v after SIGINT, want 0", err)
	}
	if !strings.Contains(stderr.String(), "synced; watching until Ctrl-C") {
		t.Errorf("no log line saying it watches, in:\n%s", stderr)
	}
}
