package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/internal/wire"
	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// streamServer serves examples/appmodel's config over an engine without a
// cluster, on a real listener with the daemon's timeouts.
func streamServer(t *testing.T, heartbeat time.Duration, writeTimeout ...time.Duration) (base string, f *msync.Feed, srv *http.Server, s *Server) {
	t.Helper()
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	e, f := fake.Engine(), fake.Feed()
	s = New(e.Inspect(), quiet)
	s.SetHeartbeat(heartbeat)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv = s.HTTPServer(ln.Addr().String(), quiet, nil)
	if len(writeTimeout) > 0 {
		srv.WriteTimeout = writeTimeout[0]
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), f, srv, s
}

func appModel(name string, models ...string) []byte {
	b, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "meta-test", "labels": map[string]string{"iidp": "iidp"}},
		"spec":     map[string]any{"models": models},
	})
	return b
}

func slice(name, service string, ready ...string) []byte {
	var eps []any
	for _, a := range ready {
		eps = append(eps, map[string]any{"addresses": []string{a}, "conditions": map[string]any{"ready": true}})
	}
	b, _ := json.Marshal(map[string]any{
		"metadata":  map[string]any{"name": name, "namespace": "meta-test", "labels": map[string]string{"kubernetes.io/service-name": service}},
		"endpoints": eps,
	})
	return b
}

// frames reads a stream's frames into a channel.
type frames struct {
	resp *http.Response
	ch   chan wire.Frame
}

func watch(t *testing.T, url string) *frames {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s %s", url, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	fs := &frames{resp: resp, ch: make(chan wire.Frame, 100000)}
	go func() {
		defer close(fs.ch)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var f wire.Frame
			if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
				panic(fmt.Sprintf("frame %q: %v", sc.Text(), err))
			}
			fs.ch <- f
		}
	}()
	return fs
}

func (fs *frames) next(t *testing.T) wire.Frame {
	t.Helper()
	select {
	case f, ok := <-fs.ch:
		if !ok {
			t.Fatal("the stream ended")
		}
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("no frame in 5s")
	}
	return wire.Frame{}
}

func show(f wire.Frame) string {
	s := f.Type
	if f.Key != nil {
		s += " " + *f.Key
	}
	if f.Values != nil {
		s += " [" + strings.Join(*f.Values, ",") + "]"
	}
	return s
}

func TestStreamChainFollowsAppAndAddresses(t *testing.T) {
	base, f, _, _ := streamServer(t, time.Hour)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(f.Apply("appmodels", appModel("base", "model1")))
	must(f.Apply("endpointslices", slice("base-1", "base", "10.0.0.5")))
	fs := watch(t, base+"/v1/chains/model-to-addresses/keys/model1?watch=true")
	first := fs.next(t)
	if first.Chain != "model-to-addresses" || first.Index != "" || first.Version == "" || show(first) != "snapshot model1 [10.0.0.5]" {
		t.Fatalf("first frame %+v", first)
	}
	must(f.Apply("endpointslices", slice("base-1", "base", "10.0.0.5", "10.0.0.6")))
	if got := show(fs.next(t)); got != "update model1 [10.0.0.5,10.0.0.6]" {
		t.Fatal(got)
	}
	must(f.Apply("appmodels", appModel("base", "model2")))
	if got := show(fs.next(t)); got != "update model1 []" {
		t.Fatal(got)
	}
}

func TestStreamIndexThenResume(t *testing.T) {
	base, f, _, _ := streamServer(t, time.Hour)
	_ = f.Apply("appmodels", appModel("a", "m1", "m2"))
	fs := watch(t, base+"/v1/indexes/model-to-app/keys?watch=true")
	var got []string
	var synced wire.Frame
	for {
		fr := fs.next(t)
		if fr.Type == wire.FrameSynced {
			synced = fr
			break
		}
		got = append(got, show(fr))
	}
	if !slices.Equal(got, []string{"snapshot m1 [a]", "snapshot m2 [a]"}) || synced.Index != "model-to-app" {
		t.Fatalf("initial: %v then %+v", got, synced)
	}
	_ = f.Apply("appmodels", appModel("b", "m3"))
	upd := fs.next(t)
	if show(upd) != "update m3 [b]" {
		t.Fatal(show(upd))
	}
	fs.resp.Body.Close()

	_ = f.Apply("appmodels", appModel("a", "m1"))
	fs = watch(t, base+"/v1/indexes/model-to-app/keys?watch=true&version="+upd.Version)
	if got := show(fs.next(t)); got != "update m2 []" {
		t.Fatalf("resume: %s", got)
	}
	if fr := fs.next(t); fr.Type != "synced" {
		t.Fatalf("resume: %+v", fr)
	}
	fs.resp.Body.Close()

	fs = watch(t, base+"/v1/indexes/model-to-app/keys?watch=true&version=from-another-life")
	if fr := fs.next(t); fr.Type != "reset" || fr.Version == "" || fr.Index != "" {
		t.Fatalf("unknown version: %+v", fr)
	}
	if fr := fs.next(t); fr.Type != "snapshot" {
		t.Fatalf("after reset: %+v", fr)
	}
}

func TestStreamUnknownIs404(t *testing.T) {
	base, _, _, _ := streamServer(t, time.Hour)
	for _, path := range []string{"/v1/indexes/nope/keys/k?watch=true", "/v1/indexes/nope/keys?watch=true", "/v1/chains/nope/keys/k?watch=true"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || !strings.Contains(string(b), `"error":"unknown`) {
			t.Errorf("%s: %d %s", path, resp.StatusCode, b)
		}
	}
}

// TestStreamOutlivesWriteTimeout: heartbeats keep a stream going past the
// server's WriteTimeout, and the drain ends it cleanly.
func TestStreamOutlivesWriteTimeout(t *testing.T) {
	base, f, srv, _ := streamServer(t, 100*time.Millisecond, 500*time.Millisecond)
	_ = f.Apply("appmodels", appModel("a", "m1"))
	fs := watch(t, base+"/v1/indexes/model-to-app/keys/m1?watch=true")
	snap := fs.next(t)
	deadline := time.Now().Add(2 * time.Second) // four WriteTimeouts
	beats := 0
	for time.Now().Before(deadline) {
		fr := fs.next(t)
		if fr.Type != "heartbeat" || fr.Version != snap.Version {
			t.Fatalf("frame %+v, want a heartbeat at %s", fr, snap.Version)
		}
		beats++
	}
	if beats < 10 {
		t.Fatalf("%d heartbeats in 2s at 100ms", beats)
	}
	_ = f.Apply("appmodels", appModel("a", "m2")) // a lets go of m1
	if got := show(fs.next(t)); got != "update m1 []" {
		t.Fatal(got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a stream open: %v", err)
	}
	for fr := range fs.ch {
		if fr.Type != "heartbeat" {
			t.Fatalf("after shutdown: %+v", fr)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("drain took %v", d)
	}
}

// TestSlowStreamCostsBoundedMemory: a client that reads nothing while
// 10,000 updates go by costs the server its subscription and the socket's
// buffers, not a backlog; then it reads the latest answers.
func TestSlowStreamCostsBoundedMemory(t *testing.T) {
	base, f, _, s := streamServer(t, time.Hour)
	const keys = 100
	models := func(round int) []string {
		var ms []string
		for k := range keys {
			ms = append(ms, fmt.Sprintf("model-%03d-%d", k, round%2))
		}
		return ms
	}
	_ = f.Apply("appmodels", appModel("a", models(0)...))
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/indexes/model-to-app/keys?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
	time.Sleep(100 * time.Millisecond)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	// 101 rounds of 100 keys each going and coming: 10,100 key updates
	// (20,200 frames if none coalesced), the client reading nothing.
	for round := 1; round <= 101; round++ {
		_ = f.Apply("appmodels", appModel("a", models(round)...))
	}
	time.Sleep(200 * time.Millisecond)
	after := heap()
	growth := int64(after) - int64(before)
	t.Logf("heap growth with a stalled stream over 10,100 updates: %d bytes; coalesced %d", growth, s.engine.Subscriptions().Coalesced)
	if growth > 4<<20 {
		t.Errorf("a stalled stream grew the heap by %d bytes", growth)
	}
	// Now read: the stream ends with the latest answers, far fewer than
	// 20,000 frames.
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The stream never ends: closing its body would drain it forever; the
	// deferred conn.Close ends it.
	sc := bufio.NewScanner(resp.Body)
	mirror := map[string]string{}
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sc.Scan() {
			var fr wire.Frame
			_ = json.Unmarshal(sc.Bytes(), &fr)
			n++
			if fr.Key != nil {
				if len(*fr.Values) == 0 {
					delete(mirror, *fr.Key)
				} else {
					mirror[*fr.Key] = strings.Join(*fr.Values, ",")
				}
			}
			if len(mirror) == keys && mirror["model-000-1"] == "a" && mirror["model-099-1"] == "a" {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("did not reach the latest state; mirror has %d keys after %d frames", len(mirror), n)
	}
	t.Logf("frames read to reach the latest state: %d (of 20,200 changes)", n)
	if n >= 20200 {
		t.Errorf("%d frames: nothing coalesced", n)
	}
}

// TestFrameTypes: every event has its frame, named as the library names
// the event.
func TestFrameTypes(t *testing.T) {
	for ev := msync.EventReset; ev <= msync.EventGone; ev++ {
		if got := frameType[ev]; got == "" || got != ev.String() {
			t.Errorf("event %v: frame %q", ev, got)
		}
	}
}
