package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// openSubscriptions waits until the engine has n subscriptions open.
func openSubscriptions(t *testing.T, s *Server, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); s.engine.Subscriptions().Open != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscriptions open, want %d", s.engine.Subscriptions().Open, n)
		}
	}
}

// metric reads the value of an unlabelled metric from /metrics.
func metric(t *testing.T, base, name string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return ""
}

// TestStalledStreamDoesNotHoldShutdown guards the drain of a stream whose
// client reads nothing while its frames pile up: the server's write is
// stuck on a full socket, and Shutdown still ends it at once rather than
// waiting out the stream's write deadline.
func TestStalledStreamDoesNotHoldShutdown(t *testing.T) {
	base, f, srv, s := streamServer(t, time.Hour)
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(conn, "GET /v1/indexes/model-to-app/keys?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
	openSubscriptions(t, s, 1)
	// Rounds of 40 changed keys of 10 kB each, until the socket is full:
	// the stream has frames to write but writes none, three rounds running.
	pad := strings.Repeat("x", 10000)
	written := func() string { return metric(t, base, `metasync_stream_frames_total{type="update"}`) }
	for round, last, still := 0, "", 0; still < 3; round++ {
		if round == 200 {
			t.Fatal("the stream never stalled")
		}
		var ms []string
		for k := range 20 {
			ms = append(ms, fmt.Sprintf("%s-%d-%d", pad, k, round))
		}
		if err := f.Apply("appmodels", appModel("a", ms...)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if now := written(); now == last {
			still++
		} else {
			last, still = now, 0
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a stalled stream: %v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Shutdown with a stalled stream took %v", d)
	}
	openSubscriptions(t, s, 0)
}

// TestAbandonedStreamsAreReleased guards streams whose clients go without
// a word: requests whose context ended before the stream began,
// connections reset right after their request, and connections that read
// nothing and close. Each one's subscription and stream are released, and
// the server goes on answering.
func TestAbandonedStreamsAreReleased(t *testing.T) {
	base, f, _, s := streamServer(t, time.Hour)
	if err := f.Apply("appmodels", appModel("a", "m1")); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(base, "http://")
	paths := []string{
		"/v1/indexes/model-to-app/keys/m1?watch=true",
		"/v1/indexes/model-to-app/keys?watch=true",
		"/v1/chains/model-to-addresses/keys/m1?watch=true",
	}

	// 100 requests whose client had gone before the handler ran.
	for i := range 100 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r := httptest.NewRequest("GET", paths[i%len(paths)], nil).WithContext(ctx)
		s.ServeHTTP(httptest.NewRecorder(), r)
	}
	// 100 connections reset as soon as their request is sent.
	for i := range 100 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", paths[i%len(paths)])
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	// 100 streams that read nothing, through writes, then go.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 100 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", paths[i%len(paths)])
	}
	openSubscriptions(t, s, 100)
	for i := range 20 {
		if err := f.Apply("appmodels", appModel("a", "m1", fmt.Sprintf("x%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil

	openSubscriptions(t, s, 0)
	// A subscription closes when its client goes; its handler returns
	// soon after.
	for _, name := range []string{"metasync_streams_open", "metasync_subscriptions_open"} {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			v := metric(t, base, name)
			if v == "0" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %s after every client went", name, v)
			}
		}
	}
	fs := watch(t, base+paths[0])
	if got := show(fs.next(t)); got != "snapshot m1 [a]" {
		t.Fatalf("a stream after the others went: %s", got)
	}
	resp, err := http.Get(base + "/v1/indexes/model-to-app/keys/m1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a lookup after the streams went: %d %s", resp.StatusCode, b)
	}
}
