package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/iidp/metasync/test/testenv"
)

// TestCRDsRelativeToConfig: `crds: [crd.yaml]` names the crd.yaml next to
// the config file, not one in the working directory. validate and serve
// run from another folder: validate reads the CRD, serve installs it,
// syncs the resource (GET /readyz 200) and answers a lookup over it.
func TestCRDsRelativeToConfig(t *testing.T) {
	testenv.Need(t, env)
	root := t.TempDir()
	confDir, workDir := filepath.Join(root, "conf"), filepath.Join(root, "work")
	for _, d := range []string{confDir, workDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A group of its own: no other test installs this CRD.
	crd := testenv.LooseCRD("relpath.iidp.com", "Gizmo", "gizmos")
	addr := testenv.FreeAddr(t)
	config := `server:
  listen: ` + addr + `
crds: [crd.yaml]
resources:
  - name: gizmos
    group: relpath.iidp.com
    version: v1
    resource: gizmos
    namespace: relpath
    indexes:
      - name: gizmo-color
        key: spec.color
`
	configPath := filepath.Join(confDir, "config.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(confDir, "crd.yaml"), []byte(crd), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := env.WriteKubeconfig(t, "")

	// validate, from another folder, reads the CRD next to the config.
	validate := exec.Command(bin, "validate", "--config", configPath)
	validate.Dir = workDir
	if out, err := validate.CombinedOutput(); err != nil {
		t.Fatalf("validate from %s: %v\n%s", workDir, err, out)
	}

	// serve, from another folder, installs it and syncs the resource.
	d := startIn(t, workDir, nil, "--config", configPath, "--kubeconfig", kubeconfig)

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(bytes.TrimSpace(body))
	}
	testenv.Eventually(t, "GET /readyz", func() string {
		select {
		case <-d.done:
			t.Fatalf("metasync serve exited: %v\n%s", d.err, d.stderr)
		default:
		}
		if code, body := get("/readyz"); code != http.StatusOK {
			return body
		}
		return ""
	})
	if !strings.Contains(d.stderr.String(), `"msg":"CRDs installed and established"`) {
		t.Errorf("no CRD install in the logs")
	}
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := env.Dynamic.Resource(crds).Get(ctx, "gizmos.relpath.iidp.com", metav1.GetOptions{}); err != nil {
		t.Fatalf("CRD not installed: %v", err)
	}

	// The resource is watched: a new Gizmo shows up in its index.
	env.Namespace(t, "relpath")
	gizmo := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "relpath.iidp.com/v1",
		"kind":       "Gizmo",
		"metadata":   map[string]any{"name": "g1", "namespace": "relpath"},
		"spec":       map[string]any{"color": "blue"},
	}}
	gvr := schema.GroupVersionResource{Group: "relpath.iidp.com", Version: "v1", Resource: "gizmos"}
	if _, err := env.Dynamic.Resource(gvr).Namespace("relpath").Create(ctx, gizmo, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "gizmo g1 indexed", func() string {
		code, body := get("/v1/indexes/gizmo-color/keys/blue")
		var a struct{ Values []string }
		if code != http.StatusOK || json.Unmarshal([]byte(body), &a) != nil || len(a.Values) != 1 || a.Values[0] != "relpath/g1" {
			return body
		}
		return ""
	})
}
