package xds

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestJavaClient runs examples/xds-java, a Java program on grpc-java's
// grpc-xds built with Maven for the test: a third language routes by
// model name through the server from a bootstrap alone. A fresh client's
// calls reach both backends; then one client, calling without pause,
// follows the answer: a removed backend gets no more calls, an added one
// gets calls, and a make-before-break rollout of both backends (a new one
// added, then an old one removed and stopped, twice) fails no call; an
// update with a hostname (grpc-java takes only IP literals) is rejected
// whole, and the client keeps calling the backends it had.
// Without java or mvn, or when Maven cannot resolve the example's
// dependencies (no registry), it skips and says why.
func TestJavaClient(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Java program with Maven")
	}
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s on PATH: the Java client is not run", tool)
		}
	}
	start := time.Now()
	jar := buildJavaClient(t)
	t.Logf("mvn package: %v", time.Since(start).Round(time.Millisecond))

	a, _ := backend(t)
	b, stopB := backend(t)
	route(t, "java-app", "java-model", a, b)
	dir := t.TempDir()
	bootstrap := filepath.Join(dir, "bootstrap.json")
	if err := os.WriteFile(bootstrap, []byte(fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"java-test","locality":{"zone":"zone-a"}}}`, xdsAddr)), 0o644); err != nil {
		t.Fatal(err)
	}
	const target = "xds:///chains/model-to-endpoints/java-model"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	java := func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "java", append([]string{"-jar", jar, target}, args...)...)
		cmd.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+bootstrap)
		return cmd
	}

	// Spread: a fresh client's calls reach both backends.
	start = time.Now()
	out, err := java("8").CombinedOutput()
	if err != nil {
		t.Fatalf("java client, 8 calls: %v\n%s", err, out)
	}
	if got := answers(string(out)); got[a] == 0 || got[b] == 0 {
		t.Fatalf("the Java client's calls did not reach both backends %s and %s: %v\n%s", a, b, got, out)
	}
	t.Logf("8 calls from a fresh client (JVM start included): %v", time.Since(start).Round(time.Millisecond))

	// One client calls without pause while the answer changes.
	start = time.Now()
	c := startJavaCalls(t, java("--for", "90"))
	c.waitFor(t, "calls reach both backends", 0, func(got map[string]int, _ []string) bool { return got[a] > 0 && got[b] > 0 })
	t.Logf("continuous client answered by both backends: %v", time.Since(start).Round(time.Millisecond))

	// Removal: once the client has the new answer, no call reaches a.
	start = time.Now()
	route(t, "java-app", "java-model", b)
	c.converge(t, "a removed backend gets no call", a)
	mark := c.mark()
	c.waitFor(t, "50 more calls", mark, func(_ map[string]int, lines []string) bool { return len(lines) >= 50 })
	if got, n := c.since(mark); got[a] != 0 || got[b] != n {
		t.Errorf("after the answer lost %s: %v", a, got)
	}
	t.Logf("removal followed: %v", time.Since(start).Round(time.Millisecond))

	// Addition: calls reach a backend the answer gains.
	start = time.Now()
	n, stopN := backend(t)
	route(t, "java-app", "java-model", b, n)
	mark = c.mark()
	c.waitFor(t, "an added backend gets calls", mark, func(got map[string]int, _ []string) bool { return got[n] > 0 && got[b] > 0 })
	t.Logf("addition followed: %v", time.Since(start).Round(time.Millisecond))

	current := javaRollout(t, c, b, stopB, n, stopN)
	javaHostnameRejected(t, c, current)

	// The client's own count, on SIGTERM, covers its whole run.
	summary := c.stop(t)
	all := c.lines()
	failedAll := 0
	for _, l := range all {
		if !strings.Contains(l, ": answered by ") {
			failedAll++
		}
	}
	if want := fmt.Sprintf("calls: %d, failed: %d", len(all), failedAll); summary != want {
		t.Errorf("the client's summary is %q, its lines say %q", summary, want)
	}
	if failedAll != 0 {
		t.Errorf("%d calls of the continuous client failed", failedAll)
	}
	t.Logf("continuous client: %s", summary)
}

// javaRollout is a make-before-break rollout under c, the client calling
// without pause: each old backend, b then n, is replaced by a new one,
// added first, then removed from the answer and stopped once no call
// reaches it. No call fails; it returns the backends after the rollout.
func javaRollout(t *testing.T, c *javaCalls, b string, stopB func(), n string, stopN func()) []string {
	start := time.Now()
	rollout := c.mark()
	current := []string{b, n}
	for _, old := range []struct {
		addr string
		stop func()
	}{{b, stopB}, {n, stopN}} {
		fresh, _ := backend(t)
		current = append(current, fresh)
		route(t, "java-app", "java-model", current...)
		c.waitFor(t, "the new backend "+fresh+" gets calls", c.mark(), func(got map[string]int, _ []string) bool { return got[fresh] > 0 })
		current = without(current, old.addr)
		route(t, "java-app", "java-model", current...)
		c.converge(t, "the old backend "+old.addr+" gets no call", old.addr)
		old.stop()
	}
	mark := c.mark()
	c.waitFor(t, "50 calls after the rollout", mark, func(_ map[string]int, lines []string) bool { return len(lines) >= 50 })
	if got, n := c.since(mark); got[current[0]]+got[current[1]] != n {
		t.Errorf("after the rollout to %v: %v", current, got)
	}
	failed := 0
	for _, l := range c.lines()[rollout:] {
		if !strings.Contains(l, ": answered by ") {
			failed++
		}
	}
	if failed != 0 {
		t.Errorf("%d of %d calls failed during the rollout:\n%s", failed, len(c.lines()[rollout:]), strings.Join(c.lines()[rollout:], "\n"))
	}
	t.Logf("rollout of 2 backends, %d calls, %d failed: %v", len(c.lines()[rollout:]), failed, time.Since(start).Round(time.Millisecond))
	return current
}

// javaHostnameRejected: a hostname in an update. grpc-java accepts only IP
// literals as endpoint addresses, rejects the whole assignment, and c
// keeps calling current, the backends of the one it accepted last.
// (@endpoints gives nothing of a slice of addressType FQDN; this one
// leaves its type out, which the test's feed allows, as a config's own
// HOST:PORT rule could answer a hostname.)
func javaHostnameRejected(t *testing.T, c *javaCalls, current []string) {
	start := time.Now()
	mark := c.mark()
	hostname, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": "java-app-fqdn", "namespace": "meta-test", "labels": map[string]string{"kubernetes.io/service-name": "java-app"}},
		"ports":     []any{map[string]any{"name": "http", "port": 8080}},
		"endpoints": []any{map[string]any{"addresses": []string{"backend.example"}, "conditions": map[string]any{"ready": true}}}})
	if err := feeder.Apply("endpointslices", hostname); err != nil {
		t.Fatal(err)
	}
	why := ""
	eventually(t, "the Java client rejects an assignment with a hostname", func() string {
		for _, cs := range xdsSrv.Clients() {
			if eds := cs.Types["endpoint"]; cs.Node == "java-test" && strings.Contains(eds.Why, "backend.example") {
				why = eds.Why
				return ""
			}
		}
		return fmt.Sprintf("%+v", xdsSrv.Clients())
	})
	c.waitFor(t, "20 calls after the rejection", c.mark(), func(_ map[string]int, lines []string) bool { return len(lines) >= 20 })
	route(t, "java-app", "java-model", current...)
	if got, n := c.since(mark); got[current[0]]+got[current[1]] != n {
		t.Errorf("with a hostname rejected, calls went elsewhere than %v: %v", current, got)
	}
	t.Logf("a hostname rejected in %v: %s", time.Since(start).Round(time.Millisecond), why)
}

// buildJavaClient copies examples/xds-java into a temporary folder (the
// checkout stays clean) and builds it with Maven, whose local repository
// (~/.m2 by default) keeps the dependencies for the next run; it returns
// the jar's path. A build that cannot resolve its dependencies skips.
func buildJavaClient(t *testing.T) string {
	t.Helper()
	example := filepath.Join("..", "..", "..", "..", "examples", "xds-java")
	dir := t.TempDir()
	err := filepath.WalkDir(example, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(example, path)
		if d.IsDir() {
			if rel == "target" {
				return filepath.SkipDir // a build made by hand in the example
			}
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		if rel != "pom.xml" && !strings.HasPrefix(rel, "src"+string(filepath.Separator)) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mvn := exec.CommandContext(ctx, "mvn", "-q", "-B", "package")
	mvn.Dir = dir
	if out, err := mvn.CombinedOutput(); err != nil {
		for _, unresolved := range []string{"could not be resolved", "Could not resolve", "Could not transfer", "Cannot access", "Non-resolvable"} {
			if strings.Contains(string(out), unresolved) {
				t.Skipf("Maven cannot resolve the Java client's dependencies (no registry?): %v\n%s", err, out)
			}
		}
		t.Fatalf("mvn package: %v\n%s", err, out)
	}
	return filepath.Join(dir, "target", "xds-java-client.jar")
}

// answers counts who answered the calls of a client's output lines
// ("call N: answered by IP:PORT"), and the failed calls as "error".
func answers(out string) map[string]int {
	got := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "call ") {
			continue
		}
		if _, peer, ok := strings.Cut(l, ": answered by "); ok {
			got[peer]++
		} else {
			got["error"]++
		}
	}
	return got
}

// javaCalls is the Java client in its continuous mode: the lines of its
// calls as they come.
type javaCalls struct {
	cmd     *exec.Cmd
	stderr  lockedBuffer // grpc-java's log
	mu      sync.Mutex
	calls   []string // "call N: ..." lines
	summary string   // "calls: N, failed: F"
	done    chan struct{}
}

// startJavaCalls starts cmd and reads its lines until it exits.
func startJavaCalls(t *testing.T, cmd *exec.Cmd) *javaCalls {
	t.Helper()
	c := &javaCalls{cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &c.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			l := s.Text()
			c.mu.Lock()
			if strings.HasPrefix(l, "call ") {
				c.calls = append(c.calls, l)
			} else if strings.HasPrefix(l, "calls: ") {
				c.summary = l
			}
			c.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
		_ = cmd.Wait()
	})
	return c
}

// lines is every call's line so far.
func (c *javaCalls) lines() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[:len(c.calls):len(c.calls)]
}

// mark is the number of calls so far: since(mark) counts those after.
func (c *javaCalls) mark() int { return len(c.lines()) }

// since counts who answered the calls after mark, and how many calls
// that is, both from one snapshot (the client keeps calling).
func (c *javaCalls) since(mark int) (map[string]int, int) {
	lines := c.lines()[mark:]
	return answers(strings.Join(lines, "\n")), len(lines)
}

// waitFor waits up to 20 s for ok to hold of the calls after mark.
func (c *javaCalls) waitFor(t *testing.T, what string, mark int, ok func(got map[string]int, lines []string) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		lines := c.lines()[mark:]
		if ok(answers(strings.Join(lines, "\n")), lines) {
			return
		}
		select {
		case <-c.done:
			t.Fatalf("%s: the Java client exited: %v\n%s\n%s", what, c.cmd.Wait(), strings.Join(lines, "\n"), c.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			tail := lines[max(0, len(lines)-20):]
			t.Fatalf("%s: after %d calls, %v; the last:\n%s\n%s", what, len(lines), answers(strings.Join(lines, "\n")), strings.Join(tail, "\n"), c.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// converge waits until 20 calls in a row have been answered, none by
// gone: the client has the answer without it.
func (c *javaCalls) converge(t *testing.T, what string, gone string) {
	t.Helper()
	c.waitFor(t, what, c.mark(), func(_ map[string]int, lines []string) bool {
		run := 0
		for _, l := range lines {
			if _, peer, ok := strings.Cut(l, ": answered by "); ok && peer != gone {
				run++
			} else {
				run = 0
			}
		}
		return run >= 20
	})
}

// stop ends the client with SIGTERM and returns its summary line.
func (c *javaCalls) stop(t *testing.T) string {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the Java client did not stop on SIGTERM\n%s", c.stderr.String())
	}
	err := c.cmd.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil && c.summary != "" && strings.HasSuffix(c.summary, "failed: 0") {
		t.Errorf("the Java client failed no call but exited: %v", err)
	}
	return c.summary
}

// lockedBuffer is a buffer that a process writes while a test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// without is addrs less one.
func without(addrs []string, one string) []string {
	var out []string
	for _, a := range addrs {
		if a != one {
			out = append(out, a)
		}
	}
	return out
}
