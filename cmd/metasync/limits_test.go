package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iidp/metasync/test/testenv"
)

// limitsConfig is a config of AppModels and EndpointSlices of the e2e
// namespace (see setupCluster) on listen.
func limitsConfig(t *testing.T, listen string) string {
	t.Helper()
	cfg := fmt.Sprintf(`
server:
  listen: %s
resources:
  - name: appmodels
    group: iidp.com
    version: v1
    resource: appmodels
    namespace: e2e
    labelSelector: iidp=iidp
    indexes:
      - name: model-to-app
        key: spec.models
        value: metadata.name
  - name: endpointslices
    group: discovery.k8s.io
    version: v1
    resource: endpointslices
    namespace: e2e
    labelSelector: kubernetes.io/service-name
    indexes:
      - name: service-to-addresses
        key: 'metadata.labels.kubernetes\.io/service-name'
        value: 'endpoints.#(conditions.ready==true)#.addresses|@flatten'
chains:
  - name: model-to-addresses
    indexes: [model-to-app, service-to-addresses]
`, listen)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// dialFrom connects to addr from the loopback address ip (127.0.0.2 and
// the like: another caller, as the daemon counts them without auth).
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ip, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// streamFrom asks for a stream of model1 from ip on a connection of its
// own. An open stream (200) has its first frame read, and its connection
// stays open until the test ends; a refusal is returned with its body.
func streamFrom(t *testing.T, ip, addr string) (code int, header http.Header, body string) {
	t.Helper()
	c := dialFrom(t, ip, addr)
	fmt.Fprintf(c, "GET /v1/indexes/model-to-app/keys/model1?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("stream from %s: %v", ip, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		return resp.StatusCode, resp.Header, string(b)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, `"type":"snapshot"`) {
		t.Fatalf("stream from %s: first frame %q, %v", ip, line, err)
	}
	return resp.StatusCode, resp.Header, line
}

// wantRefusal checks a refusal at a limit: the status, the API's JSON
// error, a Retry-After.
func wantRefusal(t *testing.T, what string, code int, header http.Header, body string, want int) {
	t.Helper()
	var e map[string]string
	if code != want || header.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(body), &e) != nil || e["error"] == "" || header.Get("Retry-After") == "" {
		t.Fatalf("%s: %d %v %s, want %d with a JSON error and Retry-After", what, code, header, body, want)
	}
}

// probesAnswer checks that /livez, /readyz and lookups answer 200, each on
// a connection of its own.
func probesAnswer(t *testing.T, addr, when string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for _, path := range []string{"/livez", "/readyz", "/v1/indexes/model-to-app/keys/model1", "/v1/chains/model-to-addresses/keys/model1", "/v1/indexes/model-to-app/keys"} {
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("%s %s: %v", when, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", when, path, resp.StatusCode, b)
		}
	}
}

// TestServeStreamLimits: the real daemon with --max-streams 4 and a limit
// of 2 per caller (from its environment variable): a caller's third stream
// gets 429, the fifth stream of all 503, each with a JSON error and
// Retry-After; probes and lookups answer meanwhile; /metrics counts the
// refusals by reason; a place freed by a stream that ends is taken again.
func TestServeStreamLimits(t *testing.T) {
	testenv.Need(t, env)
	setupCluster(t)
	addr := testenv.FreeAddr(t)
	d := start(t, []string{"METASYNC_MAX_STREAMS_PER_CALLER=2"},
		"--config", limitsConfig(t, addr), "--kubeconfig", env.WriteKubeconfig(t, ""), "--max-streams", "4")
	waitHTTP(t, d, addr)
	testenv.Eventually(t, "ready", func() string {
		if a := call(t, "GET", base(addr)+"/readyz"); a.code != 200 {
			return a.raw
		}
		return ""
	})
	for _, ip := range []string{"127.0.0.1", "127.0.0.1"} {
		if code, _, body := streamFrom(t, ip, addr); code != 200 {
			t.Fatalf("stream from %s: %d %s", ip, code, body)
		}
	}
	code, h, body := streamFrom(t, "127.0.0.1", addr)
	wantRefusal(t, "a caller's third stream", code, h, body, http.StatusTooManyRequests)
	c2 := dialFrom(t, "127.0.0.2", addr) // one of .2's streams, ended below
	fmt.Fprintf(c2, "GET /v1/indexes/model-to-app/keys/model1?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c2), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("another caller's stream: %v %v", resp, err)
	}
	if code, _, body := streamFrom(t, "127.0.0.2", addr); code != 200 {
		t.Fatalf("another caller's second stream: %d %s", code, body)
	}
	code, h, body = streamFrom(t, "127.0.0.3", addr)
	wantRefusal(t, "the fifth stream of all", code, h, body, http.StatusServiceUnavailable)
	probesAnswer(t, addr, "while streams are refused:")

	m := samples(t, base(addr))
	for sample, want := range map[string]float64{
		`metasync_http_refused_total{reason="streams_per_caller"}`: 1,
		`metasync_http_refused_total{reason="streams"}`:            1,
		`metasync_http_refused_total{reason="connections"}`:        0,
		`metasync_http_limit{limit="streams"}`:                     4,
		`metasync_http_limit{limit="streams_per_caller"}`:          2,
		`metasync_streams_open`:                                    4,
	} {
		if m[sample] != want {
			t.Errorf("%s = %v, want %v", sample, m[sample], want)
		}
	}

	c2.Close()
	testenv.Eventually(t, "a stream once another ended", func() string {
		if code, _, body := streamFrom(t, "127.0.0.3", addr); code != 200 {
			return fmt.Sprintf("%d %s", code, body)
		}
		return ""
	})
}

// TestServeConnectionFlood: the real daemon under a file descriptor limit
// of 256, its limits left to their defaults (192 connections, 168
// streams, 42 per caller): 168 streams of four callers, then a flood of
// 300 connections that send nothing. The daemon never runs out of
// descriptors: it closes the idle connections to make room, refuses the
// streams beyond its limits (429 and 503, counted), and probes and
// lookups answer throughout. Without the limits the streams and the flood
// take every descriptor and accept fails (EMFILE): probes time out.
func TestServeConnectionFlood(t *testing.T) {
	testenv.Need(t, env)
	setupCluster(t)
	addr := testenv.FreeAddr(t)
	d := &daemon{stderr: &testenv.Buffer{}, done: make(chan struct{})}
	d.cmd = exec.Command("sh", "-c", `ulimit -n 256 && exec "$0" serve "$@"`, bin,
		"--config", limitsConfig(t, addr), "--kubeconfig", env.WriteKubeconfig(t, ""))
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.done
		if t.Failed() {
			t.Logf("metasync serve stderr:\n%s", d.stderr)
		}
	})
	waitHTTP(t, d, addr)
	testenv.Eventually(t, "ready", func() string {
		if a := call(t, "GET", base(addr)+"/readyz"); a.code != 200 {
			return a.raw
		}
		return ""
	})
	m := samples(t, base(addr))
	for sample, want := range map[string]float64{
		`metasync_http_limit{limit="connections"}`:        192,
		`metasync_http_limit{limit="streams"}`:            168,
		`metasync_http_limit{limit="streams_per_caller"}`: 42,
	} {
		if m[sample] != want {
			t.Fatalf("%s = %v, want %v (the defaults under 256 descriptors)", sample, m[sample], want)
		}
	}

	callers := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"}
	for _, ip := range callers {
		for i := range 42 {
			if code, _, body := streamFrom(t, ip, addr); code != 200 {
				t.Fatalf("stream %d from %s: %d %s", i, ip, code, body)
			}
		}
	}
	code, h, body := streamFrom(t, "127.0.0.1", addr)
	wantRefusal(t, "a caller's 43rd stream", code, h, body, http.StatusTooManyRequests)
	code, h, body = streamFrom(t, "127.0.0.5", addr)
	wantRefusal(t, "the 169th stream", code, h, body, http.StatusServiceUnavailable)
	probesAnswer(t, addr, "with every stream taken:")

	for range 300 {
		dialFrom(t, "127.0.0.6", addr)
	}
	probesAnswer(t, addr, "after a flood of 300 idle connections:")
	// Requests that announce a body and never send it, more than the
	// connections: each gets 400 at once, none holds its connection.
	for i := range 300 {
		c := dialFrom(t, "127.0.0.8", addr)
		fmt.Fprintf(c, "GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n")
		if i%50 == 49 {
			probesAnswer(t, addr, fmt.Sprintf("with %d requests whose body never comes:", i+1))
		}
	}
	code, h, body = streamFrom(t, "127.0.0.7", addr)
	wantRefusal(t, "a stream after the flood", code, h, body, http.StatusServiceUnavailable)

	m = samples(t, base(addr))
	if n := m["metasync_http_connections_evicted_total"]; n < 300-24 {
		t.Errorf("%v idle connections closed to make room, want at least %d", n, 300-24)
	}
	if n := m[`metasync_http_refused_total{reason="streams"}`]; n != 2 {
		t.Errorf(`metasync_http_refused_total{reason="streams"} = %v, want 2`, n)
	}
	if n := m[`metasync_http_refused_total{reason="streams_per_caller"}`]; n != 1 {
		t.Errorf(`metasync_http_refused_total{reason="streams_per_caller"} = %v, want 1`, n)
	}
	if n := m["metasync_http_connections_open"]; n > 192 {
		t.Errorf("%v connections open, limit 192", n)
	}
	if n := m["process_open_fds"]; n >= 256 {
		t.Errorf("%v descriptors open, limit 256", n)
	}
	if strings.Contains(d.stderr.String(), "too many open files") {
		t.Errorf("the daemon ran out of descriptors:\n%s", d.stderr)
	}
}
