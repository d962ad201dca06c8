package xds

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNodeClient runs examples/xds-node, a Node program on grpc-js and
// grpc-js-xds installed from npm for the test: a second language routes
// by model name through the server, from a bootstrap alone, and follows a
// removed backend. Without node or npm, or when npm cannot install, it
// skips and says why.
func TestNodeClient(t *testing.T) {
	if testing.Short() {
		t.Skip("installs npm packages")
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s on PATH: the Node client is not run", tool)
		}
	}
	example := filepath.Join("..", "..", "..", "..", "examples", "xds-node")
	dir := t.TempDir()
	for _, f := range []string{"package.json", "client.js"} {
		b, err := os.ReadFile(filepath.Join(example, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cache := filepath.Join(os.Getenv("HOME"), ".cache", "metasync", "npm")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--cache", cache)
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Skipf("npm install failed (no registry?): %v\n%s", err, out)
	}
	a, _ := backend(t)
	b, _ := backend(t)
	route(t, "node-app", "node-model", a, b)
	bootstrap := filepath.Join(dir, "bootstrap.json")
	_ = os.WriteFile(bootstrap, []byte(fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"node-test","locality":{"zone":"zone-a"}}}`, xdsAddr)), 0o644)
	run := func(calls int) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "node", "client.js", "xds:///chains/model-to-endpoints/node-model", fmt.Sprint(calls))
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+bootstrap)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("node client.js: %v\n%s", err, out)
		}
		return string(out)
	}
	out := run(8)
	if !strings.Contains(out, "answered by "+a) || !strings.Contains(out, "answered by "+b) {
		t.Errorf("the Node client's calls did not reach both backends:\n%s", out)
	}
	route(t, "node-app", "node-model", b)
	if out := run(4); strings.Contains(out, a) || strings.Count(out, "answered by "+b) != 4 {
		t.Errorf("after the answer lost %s:\n%s", a, out)
	}
}
