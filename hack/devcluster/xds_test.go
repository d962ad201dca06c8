package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/test/testenv"
)

// walkThrough returns the lines of the sh block under docs/xds.md's
// heading "Try it with make run", as written.
func walkThrough(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "xds.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "## Try it with make run\n")
	if !ok {
		t.Fatal("docs/xds.md has no heading \"Try it with make run\"")
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/xds.md: no sh block under \"Try it with make run\"")
	}
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestXDSWalkThrough runs docs/xds.md's walk-through on make run's own
// program: devcluster with xDS and its gRPC servers behind the reference
// Services, then the page's grpc-go line and (with node and npm, and a
// registry to install from) its Node line, as written, but for the
// addresses and files of this run. Each client's calls are answered by
// the servers devcluster printed, from the zone its bootstrap names.
func TestXDSWalkThrough(t *testing.T) {
	needControlPlane(t)
	lines := walkThrough(t)
	if len(lines) != 3 || lines[0] != "make run" {
		t.Fatalf("docs/xds.md's walk-through is %q: adapt the test", lines)
	}
	_, metasync := binaries(t)
	dir := t.TempDir()
	bootstrap := filepath.Join(dir, "xds-bootstrap.json")
	configCopy := filepath.Join(dir, "run-config.yaml")
	addr := testenv.FreeAddr(t)
	// The flags make run passes, with free ports and the test's files.
	d := startDevcluster(t, "--metasync", metasync, "--listen", addr, "--xds-listen", "127.0.0.1:0",
		"--bootstrap-out", bootstrap, "--config-copy", configCopy, "--kubeconfig-out", filepath.Join(dir, "kubeconfig"))
	d.waitFor(t, "Ctrl-C stops everything.", 3*time.Minute)
	out := d.out.String()
	for _, want := range []string{
		"==> metasync serves on http://" + addr,
		"xDS on 127.0.0.1:",
		"GRPC_XDS_BOOTSTRAP=" + bootstrap + " go run ./examples/appmodel/grpcclient --xds --calls 6",
		"node client.js xds:///chains/model-to-endpoints/model1 6",
		"Live reload: edit " + configCopy,
		"make apply FILE=" + anotherApp,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("devcluster does not print %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(root, anotherApp)); err != nil {
		t.Errorf("the Try block's file: %v", err)
	}
	// The servers behind the slices, as printed; zone-a's are base-a's
	// and base-c's.
	servers := map[string]string{}
	for _, m := range regexp.MustCompile(`EndpointSlice meta-test/(\S+) -> (\S+)`).FindAllStringSubmatch(out, -1) {
		servers[m[1]] = m[2]
	}
	if len(servers) != 4 {
		t.Fatalf("devcluster printed %d servers:\n%s", len(servers), out)
	}
	resp, err := http.Get("http://" + addr + "/v1/chains/model-to-endpoints/keys/model1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, s := range []string{"base-a", "base-b", "base-c"} {
		if !strings.Contains(string(body), servers[s]) {
			t.Errorf("model1 does not answer %s's server %s: %s", s, servers[s], body)
		}
	}
	answered := func(who, out string) {
		t.Helper()
		if n := strings.Count(out, "answered by "); n != 6 {
			t.Errorf("%s: %d of 6 calls answered:\n%s", who, n, out)
		}
		for _, zoneA := range []string{servers["base-a"], servers["base-c"]} {
			if !strings.Contains(out, "answered by "+zoneA) {
				t.Errorf("%s: no call answered by %s (zone-a):\n%s", who, zoneA, out)
			}
		}
		if strings.Contains(out, servers["base-b"]) || strings.Contains(out, servers["iiot-a"]) {
			t.Errorf("%s: a call outside model1's zone-a servers:\n%s", who, out)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// grpc-go, as the page says, from the repository's top folder.
	goLine := strings.Replace(lines[1], "bin/xds-bootstrap.json", bootstrap, 1)
	cmd := exec.CommandContext(ctx, "sh", "-c", goLine)
	cmd.Dir = root
	got, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", goLine, err, got)
	}
	answered("grpc-go", string(got))

	// Node, in a copy of the example (npm install writes node_modules).
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s on PATH: the Node line is not run", tool)
		}
	}
	nodeDir := t.TempDir()
	for _, f := range []string{"package.json", "client.js"} {
		b, err := os.ReadFile(filepath.Join(root, "examples", "xds-node", f))
		if err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(nodeDir, f), b, 0o644)
	}
	install := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--cache", filepath.Join(os.Getenv("HOME"), ".cache", "metasync", "npm"))
	install.Dir = nodeDir
	if out, err := install.CombinedOutput(); err != nil {
		t.Skipf("npm install failed (no registry?): %v\n%s", err, out)
	}
	nodeLine, ok := strings.CutPrefix(lines[2], "(cd examples/xds-node && npm install && ")
	nodeLine, closed := strings.CutSuffix(nodeLine, ")")
	if !ok || !closed {
		t.Fatalf("the Node line changed: %q", lines[2])
	}
	nodeLine = strings.Replace(nodeLine, "../../bin/xds-bootstrap.json", bootstrap, 1)
	cmd = exec.CommandContext(ctx, "sh", "-c", nodeLine)
	cmd.Dir = nodeDir
	got, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", nodeLine, err, got)
	}
	answered("Node", string(got))
}

// TestNotReadyStillPrintsTheTryBlock: a config with a resource that the
// cluster does not serve (a CRD that make run's cluster lacks) never gets
// ready; devcluster names that resource and prints the commands to try
// all the same, and metasync keeps serving the rest.
func TestNotReadyStillPrintsTheTryBlock(t *testing.T) {
	needControlPlane(t)
	_, metasync := binaries(t)
	dir := t.TempDir()
	body, err := os.ReadFile(filepath.Join(root, exampleConfig))
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "config.yaml")
	_ = os.WriteFile(config, []byte(strings.Replace(string(body), "\nchains:", `
  - name: gadgets
    group: nothere.iidp.com
    version: v1
    resource: gadgets
    indexes:
      - {name: color-to-gadget, key: spec.color}
chains:`, 1)), 0o600)
	addr := testenv.FreeAddr(t)
	d := startDevcluster(t, "--metasync", metasync, "--listen", addr, "--config", config, "--ready-timeout", "3s", "--backends=false")
	d.waitFor(t, "Ctrl-C stops everything.", 2*time.Minute)
	out := d.out.String()
	for _, want := range []string{"is not ready after 3s: not ready: gadgets: ", "==> metasync serves on http://" + addr + ". Try:", "Live reload: edit " + config} {
		if !strings.Contains(out, want) {
			t.Errorf("devcluster does not print %q:\n%s", want, out)
		}
	}
	resp, err := http.Get("http://" + addr + "/v1/indexes/model-to-app/keys/model1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"values":["base"]`) {
		t.Errorf("model1 = %s", b)
	}
}
