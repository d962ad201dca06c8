package grpcresolver_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	"github.com/iidp/metasync/grpcresolver"
)

// errorRecorder is a resolver.ClientConn that keeps the errors reported.
type errorRecorder struct {
	mu     gosync.Mutex
	errs   []error
	states int
}

func (c *errorRecorder) UpdateState(resolver.State) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.states++
	return nil
}

func (c *errorRecorder) ReportError(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, err)
}

func (c *errorRecorder) NewAddress([]resolver.Address) {}

func (c *errorRecorder) ParseServiceConfig(string) *serviceconfig.ParseResult {
	return &serviceconfig.ParseResult{}
}

func (c *errorRecorder) reported() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

// TestRemoteEndlessLine: a daemon (or anything at its address) that
// answers a stream with a line that never ends costs the remote resolver
// a bounded read: the resolver reports an error naming the bound, keeps
// no addresses from it, and reconnects, each time reading no more than
// the bound (4 MiB; it read 64 MiB, in buffers of about twice that, per
// reconnect).
func TestRemoteEndlessLine(t *testing.T) {
	var conns atomic.Int32
	var most atomic.Int64
	chunk := bytes.Repeat([]byte("1"), 64<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conns.Add(1)
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"type":"snapshot","values":["10.0.0.`))
		var n int64
		for {
			if _, err := w.Write(chunk); err != nil {
				break
			}
			n += int64(len(chunk))
		}
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
	}))
	defer srv.Close()
	target, _ := url.Parse("metasync:///chains/model-to-addresses/model1?port=9000")
	cc := &errorRecorder{}
	r, err := grpcresolver.NewRemoteBuilder(srv.URL, grpcresolver.WithLogger(slog.New(slog.DiscardHandler))).
		Build(resolver.Target{URL: *target}, cc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for len(cc.reported()) < 2 || conns.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes: %d connections, errors %v", conns.Load(), cc.reported())
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.Close()
	for _, err := range cc.reported() {
		if !strings.Contains(err.Error(), "a frame longer than 4194304 bytes") {
			t.Errorf("reported %v, want an error naming the 4 MiB bound", err)
		}
	}
	cc.mu.Lock()
	states := cc.states
	cc.mu.Unlock()
	if states != 0 {
		t.Errorf("%d states published from a stream that sent no frame", states)
	}
	// The bound, and what the sockets' buffers hold on both sides.
	if n := most.Load(); n > 4<<20+24<<20 {
		t.Errorf("one connection took %d bytes of one line", n)
	}
}
