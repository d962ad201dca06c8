package consul

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
)

// TestAnnouncedBodyHoldsNoConnection: requests that announce a body they
// never send (a write, an unknown path, a read) from two addresses that
// fill the connection limit leave room for a third caller's read: each is
// answered at once (405 for a write, 400 for a read) and its connection
// closed, never held waiting for the body.
func TestAnnouncedBodyHoldsNoConnection(t *testing.T) {
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	s := New(fake.Engine().Inspect(), []Source{{"indexes", "service-to-endpoints"}}, quiet, nil)
	s.SetLimits(Limits{Blocking: 8, BlockingPerCaller: 2, Connections: 4, ConnectionsPerCaller: 2})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.HTTPServer(nil, quiet)
	go func() { _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close(); s.Close() })
	addr := ln.Addr().String()

	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for i, tc := range []struct {
		req  string
		code int
	}{
		{"PUT /v1/catalog/register HTTP/1.1", http.StatusMethodNotAllowed},
		{"GET /v1/kv/x HTTP/1.1", http.StatusBadRequest},
		{"POST /v1/agent/self HTTP/1.1", http.StatusMethodNotAllowed},
		{"GET /v1/health/service/model1 HTTP/1.1", http.StatusBadRequest},
	} {
		req := tc.req
		c := dial(fmt.Sprintf("127.0.0.%d", 2+i/2))
		fmt.Fprintf(c, "%s\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", req)
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: no answer at once: %v", req, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code || !resp.Close {
			t.Errorf("%s: %d, close %v; want %d and the connection closed", req, resp.StatusCode, resp.Close, tc.code)
		}
	}
	c := dial("127.0.0.9")
	fmt.Fprintf(c, "GET /v1/agent/self HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a third caller's read: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a third caller's read: %d, want 200", resp.StatusCode)
	}
	if !strings.Contains(resp.Header.Get("Content-Type"), "json") {
		t.Errorf("agent/self: Content-Type %q", resp.Header.Get("Content-Type"))
	}
}
