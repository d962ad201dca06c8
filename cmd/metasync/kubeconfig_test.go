package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKubeconfigSourceIsThePath: the serve log names the kubeconfig file it
// used, not "$KUBECONFIG".
func TestKubeconfigSourceIsThePath(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kubeconfig")
	kc := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(file, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", file)
	cfg, source, err := restConfig("", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(source, file) || cfg.Host != "https://127.0.0.1:6443" {
		t.Errorf("source %q, host %q: want the file %s", source, cfg.Host, file)
	}
}
