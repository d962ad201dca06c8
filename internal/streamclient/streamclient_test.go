package streamclient

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// endlessLine is a daemon whose stream is one line that never ends: it
// writes until the client hangs up, and says on written how many bytes
// each connection took.
func endlessLine(t *testing.T) (*httptest.Server, <-chan int64) {
	t.Helper()
	written := make(chan int64, 16)
	chunk := bytes.Repeat([]byte("a"), 64<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"type":"snapshot","values":["`))
		var n int64
		for {
			if _, err := w.Write(chunk); err != nil {
				break
			}
			n += int64(len(chunk))
		}
		select {
		case written <- n:
		default:
		}
	}))
	t.Cleanup(srv.Close)
	return srv, written
}

// TestEndlessLineStopsAtTheBound: a line that never ends is read up to
// the frame bound and no further: the stream breaks with an error that
// says so, the memory it took stays near the bound, and Follow reconnects
// after its backoff.
func TestEndlessLineStopsAtTheBound(t *testing.T) {
	srv, written := endlessLine(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	breaks := make(chan error, 16)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	done := make(chan error, 1)
	go func() {
		done <- Follow(ctx, srv.URL+"/v1/indexes/i/keys/k", Options{OnBreak: func(err error, retry time.Duration) {
			breaks <- err
		}}, func(Frame) error { return errors.New("no frame was sent") })
	}()
	var err error
	select {
	case err = <-breaks:
	case <-time.After(2 * time.Minute):
		t.Fatal("no break after 2 minutes of an endless line")
	}
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "longer than "+strconv.Itoa(DefaultMaxFrame)+" bytes") {
		t.Errorf("the break of an endless line: %v, want an error naming the %d-byte bound", err, DefaultMaxFrame)
	}
	// What the daemon could write: the bound, and what the sockets'
	// buffers hold on both sides.
	n := <-written
	if n > DefaultMaxFrame+24<<20 {
		t.Errorf("the daemon wrote %d bytes of one line before the client hung up: the bound is %d", n, DefaultMaxFrame)
	}
	// The reader's buffer doubles up to the bound: about twice the bound
	// allocated in all.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 3*DefaultMaxFrame {
		t.Errorf("reading one endless line allocated %d bytes: the bound is %d", alloc, DefaultMaxFrame)
	}
	t.Logf("break: %v; the daemon wrote %d bytes; %d bytes allocated", err, n, after.TotalAlloc-before.TotalAlloc)
	// Follow reconnects (after its backoff) and meets the bound again.
	select {
	case err = <-breaks:
		if !strings.Contains(err.Error(), "longer than") {
			t.Errorf("the second break: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("no reconnect after the first break")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Follow after its context ended: %v", err)
	}
}

// TestMaxFrame: a frame of up to Options.MaxFrame bytes, its newline
// included, is read whole; one byte more breaks the stream.
func TestMaxFrame(t *testing.T) {
	frame := func(n int) string {
		head := `{"type":"heartbeat","version":"`
		return head + strings.Repeat("v", n-len(head)-2) + `"}`
	}
	const limit = 100 << 10
	for _, c := range []struct {
		size int
		ok   bool
	}{{limit - 1, true}, {limit, false}} {
		line := frame(c.size)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/x-ndjson")
			_, _ = w.Write([]byte(line + "\n"))
			<-r.Context().Done()
		}))
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan string, 1)
		breaks := make(chan error, 1)
		go func() {
			_ = Follow(ctx, srv.URL+"/x", Options{MaxFrame: limit, OnBreak: func(err error, _ time.Duration) {
				select {
				case breaks <- err:
				default:
				}
			}}, func(f Frame) error {
				select {
				case got <- f.Version:
				default:
				}
				return nil
			})
		}()
		select {
		case v := <-got:
			if !c.ok || len(v) != c.size-len(`{"type":"heartbeat","version":""}`) {
				t.Errorf("a frame of %d bytes (bound %d) was read: version of %d bytes", c.size, limit, len(v))
			}
		case err := <-breaks:
			if c.ok || !strings.Contains(err.Error(), "longer than "+strconv.Itoa(limit)+" bytes") {
				t.Errorf("a frame of %d bytes (bound %d): %v", c.size, limit, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("a frame of %d bytes: nothing after a minute", c.size)
		}
		cancel()
		srv.Close()
	}
}

// TestRetryAfterIsHonoured: a refusal at the daemon's limits (429 or 503
// with Retry-After) is asked again no sooner than it says, and no later
// than the backoff would; an answer without Retry-After gets the backoff.
func TestRetryAfterIsHonoured(t *testing.T) {
	answers := []func(w http.ResponseWriter){
		func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "2")
			http.Error(w, `{"error":"too many change streams open by this caller (at most 2); retry later"}`, http.StatusTooManyRequests)
		},
		func(w http.ResponseWriter) {
			http.Error(w, `{"error":"down"}`, http.StatusServiceUnavailable)
		},
	}
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answers[min(n, len(answers)-1)](w)
		n++
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var retries []time.Duration
	done := make(chan error, 1)
	go func() {
		done <- Follow(ctx, srv.URL+"/v1/indexes/i/keys/k", Options{OnBreak: func(err error, retry time.Duration) {
			retries = append(retries, retry)
			if len(retries) == 2 {
				cancel()
			}
		}}, func(Frame) error { return errors.New("no frame was sent") })
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(retries) != 2 || retries[0] != 2*time.Second || retries[1] != time.Second {
		t.Fatalf("retries %v, want [2s 1s]: Retry-After, then the backoff", retries)
	}
}

// TestNoAnswerBreaksTheStream: a server that accepts the connection and
// never answers (a hung daemon, a proxy without a backend) breaks the
// stream after Idle, reported to OnBreak, and Follow tries again.
func TestNoAnswerBreaksTheStream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // read nothing, answer nothing
		}
	}()
	breaks := make(chan error, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		_ = Follow(ctx, "http://"+ln.Addr().String()+"/v1/indexes/i/keys/k", Options{
			Idle:    200 * time.Millisecond,
			OnBreak: func(err error, _ time.Duration) { breaks <- err },
		}, func(Frame) error { return nil })
	}()
	select {
	case err := <-breaks:
		if !strings.Contains(err.Error(), "no answer within 200ms") {
			t.Errorf("break: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("no break reported in 5 s from a server that never answers")
	}
}
