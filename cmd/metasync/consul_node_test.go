package main_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/test/testenv"
)

// TestConsulNodeClientOnTheControlPlane runs examples/consul-node, a Node
// program on the npm package consul installed from npm for the test,
// against `serve --consul-listen` on the real control plane: a second
// language's own Consul client reads agent/self and the catalog, and its
// blocking health loop follows an EndpointSlice deleted within two
// seconds. Without node or npm, or when npm cannot install, it skips and
// says why.
func TestConsulNodeClientOnTheControlPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("installs npm packages")
	}
	testenv.Need(t, env)
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s on PATH: the Node client is not run", tool)
		}
	}
	example := filepath.Join(testenv.Root(), "examples", "consul-node")
	dir := t.TempDir()
	copyFiles(t, example, dir, "package.json", "client.js")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	install := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--cache", filepath.Join(os.Getenv("HOME"), ".cache", "metasync", "npm"))
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Skipf("npm install failed (no registry?): %v\n%s", err, out)
	}
	t.Logf("npm install: %v", time.Since(began).Round(time.Millisecond))

	addr, consulAddr, backends, _ := consulDaemon(t, "consul-node", 2)
	waitFacadeAnswersModel(t, consulAddr)

	type line struct {
		text string
		at   time.Time
	}
	lines := make(chan line, 64)
	stderr := &testenv.Buffer{}
	node := exec.CommandContext(ctx, "node", "client.js", "xds-model")
	node.Dir = dir
	node.Env = append(os.Environ(), "CONSUL_HTTP_ADDR="+consulAddr)
	node.Stderr = stderr
	stdout, err := node.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			lines <- line{s.Text(), time.Now()}
		}
		close(lines)
		done <- node.Wait()
	}()
	next := func(what string) line {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("node client.js ended before %s: %v\n%s", what, <-done, stderr)
			}
			t.Logf("node: %s", l.text)
			return l
		case <-time.After(30 * time.Second):
			t.Fatalf("node client.js printed no %s in 30s:\n%s", what, stderr)
		}
		return line{}
	}
	if l := next("agent line"); !strings.HasPrefix(l.text, "agent: datacenter metasync, node ") {
		t.Errorf("agent/self: %q, want datacenter metasync", l.text)
	}
	if l := next("catalog line"); !strings.HasPrefix(l.text, "catalog: ") || !strings.Contains(" "+l.text+" ", " xds-model ") {
		t.Errorf("catalog services: %q, want xds-model among them", l.text)
	}
	first := next("first answer")
	index, instances, _ := strings.Cut(strings.TrimPrefix(first.text, "index "), ": ")
	if want := strings.Join(slices.Sorted(slices.Values(backends)), " "); instances != want {
		t.Fatalf("first answer %q, want %s", first.text, want)
	}

	// The client's next query waits on the index it was given.
	testenv.Eventually(t, "the Node client's query waits", func() string {
		if got := metric(t, base(addr), "metasync_consul_blocking_queries"); got != "1" {
			return got
		}
		return ""
	})
	deleted := time.Now()
	if err := env.Kube.DiscoveryV1().EndpointSlices("consul-node").Delete(ctx, "xds-app-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	changed := next("answer after the delete")
	took := changed.at.Sub(deleted)
	t.Logf("the Node client printed the change %v after the delete", took.Round(time.Millisecond))
	index2, instances, _ := strings.Cut(strings.TrimPrefix(changed.text, "index "), ": ")
	if instances != backends[0] {
		t.Errorf("after the delete: %q, want %s", changed.text, backends[0])
	}
	if a, b := parseIndex(index), parseIndex(index2); a == 0 || b <= a {
		t.Errorf("the index did not move forward: %s then %s", index, index2)
	}
	if took > 2*time.Second {
		t.Errorf("the change reached the Node client in %v, want within two seconds", took)
	}

	// SIGTERM cancels the query in flight: the program ends at once.
	stopped := time.Now()
	_ = node.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("node client.js after SIGTERM: %v\n%s", err, stderr)
		}
		t.Logf("the Node client ended %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Errorf("node client.js still runs 10s after SIGTERM")
	}
}

// copyFiles copies the named files of folder from into folder to.
func copyFiles(t *testing.T, from, to string, names ...string) {
	t.Helper()
	for _, f := range names {
		b, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFacadeAnswersModel waits until the Consul facade at consulAddr
// answers xds-model's two pods: it answers 503 until the sources have
// completed their first list, and a client starts once it answers.
func waitFacadeAnswersModel(t *testing.T, consulAddr string) {
	t.Helper()
	testenv.Eventually(t, "the facade answers the model", func() string {
		resp, err := http.Get("http://" + consulAddr + "/v1/health/service/xds-model")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || strings.Count(string(body), `"ServiceID"`) != 2 {
			return fmt.Sprint(resp.StatusCode, " ", string(body))
		}
		return ""
	})
}

// parseIndex is a printed X-Consul-Index, 0 when it is none.
func parseIndex(s string) uint64 {
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}
