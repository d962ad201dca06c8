package server_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/grpcresolver"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/routingtest"
)

// TestRemoteBuilder: the remote resolver (grpcresolver.NewRemoteBuilder)
// through this server's streams; while the daemon is down
// calls keep going to the last addresses; after it is back the resolver
// resumes, and follows the new daemon's answer.
func TestRemoteBuilder(t *testing.T) {
	e, f := routingtest.Engine(t)
	b1, b2 := routingtest.StartBackend(t), routingtest.StartBackend(t)
	routingtest.SetApp(t, f, "base", "model1")
	routingtest.SetBackends(t, f, "base", b1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	quiet := slog.New(slog.DiscardHandler)
	serve := func(e *msync.Engine, ln net.Listener) *http.Server {
		a := server.New(e.Inspect(), quiet)
		a.SetHeartbeat(200 * time.Millisecond)
		srv := a.HTTPServer(addr, quiet, nil)
		go func() { _ = srv.Serve(ln) }()
		return srv
	}
	srv := serve(e, ln)
	conn := routingtest.Dial(t, "metasync:///chains/model-to-addresses/model1", grpcresolver.NewRemoteBuilder("http://"+addr, grpcresolver.WithLogger(quiet)))
	routingtest.Within(t, 5*time.Second, "calls reach b1", func() bool { return routingtest.Call(conn) == nil && b1.Calls.Load() > 0 })
	routingtest.SetBackends(t, f, "base", b2)
	routingtest.Within(t, time.Second, "calls move to b2", func() bool { return routingtest.Spread(t, conn, 10, b1, b2)[b2] == 10 })

	// The daemon stops: calls keep going to the last addresses.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := routingtest.Call(conn); err != nil {
			t.Fatalf("with the daemon down: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A new daemon (a new engine: versions do not carry over) answers b1.
	e2, f2 := routingtest.Engine(t)
	routingtest.SetApp(t, f2, "base", "model1")
	routingtest.SetBackends(t, f2, "base", b1)
	var ln2 net.Listener
	routingtest.Within(t, 5*time.Second, "the port is free again", func() bool {
		ln2, err = net.Listen("tcp", addr)
		return err == nil
	})
	srv2 := serve(e2, ln2)
	defer srv2.Close()
	routingtest.Within(t, 15*time.Second, "the resolver resumes against the new daemon", func() bool {
		return routingtest.Spread(t, conn, 10, b1, b2)[b1] == 10
	})
}

// TestRemoteWithLocality: through this server's ?zone=, a remote resolver
// that says where it runs gets the backends hinted for its zone, and every
// backend once the hints are gone (in process: grpcresolver's
// TestWithLocality).
func TestRemoteWithLocality(t *testing.T) {
	e, f := routingtest.HintedEngine(t)
	quiet := slog.New(slog.DiscardHandler)
	b1, b2 := routingtest.StartBackend(t), routingtest.StartBackend(t)
	routingtest.SetApp(t, f, "base", "model1")
	bs := []*routingtest.Backend{b1, b2}
	hinted := func(zones ...string) { t.Helper(); routingtest.SetHintedBackends(t, f, "base", bs, zones...) }
	hinted("a", "b")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(e.Inspect(), quiet).HTTPServer(ln.Addr().String(), quiet, nil)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	builder := grpcresolver.NewRemoteBuilder("http://"+ln.Addr().String(), grpcresolver.WithLocality(msync.Locality{Zone: "b"}), grpcresolver.WithLogger(quiet))
	conn := routingtest.Dial(t, "metasync:///chains/model-to-addresses/model1", builder)
	routingtest.Within(t, 5*time.Second, "calls reach the zone's backend only", func() bool {
		return routingtest.Spread(t, conn, 20, b1, b2)[b2] == 20
	})
	hinted() // no hints: every backend
	routingtest.Within(t, 5*time.Second, "calls reach both", func() bool {
		got := routingtest.Spread(t, conn, 20, b1, b2)
		return got[b1] > 0 && got[b2] > 0
	})
}
