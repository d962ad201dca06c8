package server

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
)

// probe sends one GET on a connection of its own and returns the status
// line's code and the body, or the error.
func probe(addr, path string) string {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "error: " + err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

// TestAnnouncedBodyHoldsNoConnection: requests that announce a body and
// never send it, as many as the connection limit, with and without a
// token review in front, get 400 at once and their connection closed;
// probes and lookups keep answering.
func TestAnnouncedBodyHoldsNoConnection(t *testing.T) {
	const limit = 8
	quiet := slog.New(slog.DiscardHandler)
	guard, err := auth.NewTokenAuth(&rest.Config{Host: "http://127.0.0.1:1"}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	for name, g := range map[string]*auth.TokenAuth{"no auth": nil, "tokenreview": guard} {
		t.Run(name, func(t *testing.T) {
			plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			fake, err := metasynctest.New(plan)
			if err != nil {
				t.Fatal(err)
			}
			e := fake.Engine()
			s := New(e.Inspect(), quiet)
			s.SetLimits(Limits{Connections: limit, Streams: 6, StreamsPerCaller: 2})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := s.HTTPServer(ln.Addr().String(), quiet, g)
			go func() { _ = srv.Serve(s.Listener(ln)) }()
			defer srv.Close()
			addr := ln.Addr().String()
			var held []net.Conn
			// As many as the limit, of three kinds (net/http answers
			// "OPTIONS *" itself unless told not to): before, they held
			// every connection, and the probes below got 503. (More than
			// the limit would evict the first ones before their answer is
			// read, as they are the first to evict.)
			reqs := []string{"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 1", "GET /livez HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked", "OPTIONS * HTTP/1.1\r\nHost: x\r\nContent-Length: 1"}
			for i := range limit {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				fmt.Fprintf(c, "%s\r\n\r\n", reqs[i%len(reqs)])
				held = append(held, c)
			}
			for _, c := range held {
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil || resp.StatusCode != 400 || resp.Close != true {
					t.Fatalf("a request that announces a body: %v %v", resp, err)
				}
				b, _ := io.ReadAll(resp.Body)
				if !strings.Contains(string(b), "carries no body") {
					t.Errorf("answer %s", b)
				}
			}
			for _, p := range []string{"/livez", "/readyz", "/v1/indexes/model-to-app/keys/m1"} {
				got := probe(addr, p)
				if strings.HasPrefix(got, "503 {\"error\":\"too many connections") || strings.HasPrefix(got, "error") || strings.HasPrefix(got, "dial") {
					t.Errorf("probe %s while the body-announcing connections are open: %s", p, got)
				}
			}
		})
	}
}

// TestServerErrorLogIsBounded: net/http's own log (failed TLS handshakes,
// which anyone who can connect causes) keeps its first lines, then one
// every 10 s.
func TestServerErrorLogIsBounded(t *testing.T) {
	var buf strings.Builder
	l := serverErrorLog(slog.New(slog.NewTextHandler(&buf, nil)))
	for i := range 300 {
		l.Printf("http: TLS handshake error from 10.0.0.1:%d: EOF", i)
	}
	if n := strings.Count(buf.String(), "TLS handshake error"); n != 10 {
		t.Errorf("%d lines of 300, want the first 10", n)
	}
}
