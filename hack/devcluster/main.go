// Command devcluster runs metasync on a local control plane, for `make run`:
// it starts kube-apiserver and etcd (the pinned binaries that the tests
// use), installs examples/appmodel's CRD, samples and routing, runs
// `metasync serve` with examples/appmodel/config.yaml, and prints commands
// to try. Ctrl-C stops everything.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/iidp/metasync/internal/kubeapply"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "devcluster:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("metasync", "bin/metasync", "the metasync binary")
	config := flag.String("config", "examples/appmodel/config.yaml", "config for metasync serve")
	listen := flag.String("listen", "127.0.0.1:8080", "address of metasync serve")
	flag.Parse()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set: use `make run`")
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)

	fmt.Println("==> starting kube-apiserver and etcd")
	env := &envtest.Environment{
		CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{"examples/appmodel/crd.yaml"}, ErrorIfPathMissing: true},
	}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer func() {
		fmt.Println("==> stopping the control plane")
		_ = env.Stop()
	}()
	dir, err := os.MkdirTemp("", "metasync-run-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		return err
	}
	fmt.Println("==> control plane at", cfg.Host, "kubeconfig", kubeconfig)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	files := []string{"examples/appmodel/samples.yaml", "examples/appmodel/routing.yaml"}
	if err := kubeapply.Files(ctx, cfg, files...); err != nil {
		return err
	}
	fmt.Println("==> applied", files)

	cmd := exec.Command(*bin, "serve", "--config", *config, "--kubeconfig", kubeconfig, "--listen", *listen)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Own process group: a terminal's Ctrl-C reaches devcluster, which
	// forwards it, so the order of the stop stays ours.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", *bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	url := "http://" + *listen
	go func() {
		for range 300 {
			resp, err := http.Get(url + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		fmt.Printf(`
==> metasync serves on %[1]s. Try:
  curl -s %[1]s/v1/indexes
  curl -s %[1]s/v1/indexes/model-to-app/keys
  curl -s %[1]s/v1/indexes/model-to-app/keys/model1
  curl -s %[1]s/v1/chains/model-to-addresses/keys/model1
  curl -s '%[1]s/readyz?verbose'
  curl -s %[1]s/metrics | grep ^metasync_
  %[2]s get --server %[1]s model-to-app model2
  %[2]s get --server %[1]s --chain model-to-addresses iiot_dataservice
  KUBECONFIG=%[3]s kubectl get appmodels -n meta-test    # if you have kubectl
Ctrl-C stops everything.
`, url, *bin, kubeconfig)
	}()

	select {
	case err := <-exited:
		return fmt.Errorf("metasync serve exited: %v", err)
	case sig := <-sigs:
		fmt.Println("\n==> stopping metasync serve")
		_ = cmd.Process.Signal(sig)
	}
	select {
	case <-exited:
	case <-sigs:
		_ = cmd.Process.Kill()
		<-exited
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	return nil
}
