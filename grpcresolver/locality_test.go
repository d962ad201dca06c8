package grpcresolver_test

import (
	"encoding/json"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/internal/api"
	"github.com/iidp/metasync/internal/feed"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// TestWithLocality: a client that says where it runs gets the backends
// hinted for its zone, in process and through a daemon (?zone=), and every
// backend once the hints are gone.
func TestWithLocality(t *testing.T) {
	cfg := routingConfig(routingChain)
	cfg.Resources[1].Indexes[0].Hints = "hints"
	plan, err := schema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	r, f, err := feed.New(plan, quiet)
	if err != nil {
		t.Fatal(err)
	}
	e := r.(*msync.Engine)
	b1, b2 := startBackend(t), startBackend(t)
	setApp(t, f, "base", "model1")
	hinted := func(zones ...string) {
		t.Helper()
		var hints []string
		for i, b := range []*backend{b1, b2} {
			if zones != nil {
				hints = append(hints, b.addr+"\tzone="+zones[i])
			}
		}
		js, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": "base"}, "addresses": []string{b1.addr, b2.addr}, "hints": hints})
		if err := f.Apply("backends", js); err != nil {
			t.Fatal(err)
		}
	}
	hinted("a", "b")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(e, quiet).HTTPServer(ln.Addr().String(), quiet, nil)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	at := grpcresolver.WithLocality(msync.Locality{Zone: "b"})
	for _, name := range []string{"in process", "remote"} {
		t.Run(name, func(t *testing.T) {
			hinted("a", "b")
			var builder = grpcresolver.NewBuilder(e, at, grpcresolver.WithLogger(quiet))
			if name == "remote" {
				builder = grpcresolver.NewRemoteBuilder("http://"+ln.Addr().String(), at, grpcresolver.WithLogger(quiet))
			}
			conn := dial(t, "metasync:///chains/model-to-addresses/model1", builder)
			within(t, 5*time.Second, "calls reach the zone's backend only", func() bool {
				got := spread(t, conn, 20, b1, b2)
				return got[b2] == 20
			})
			hinted() // no hints: every backend
			within(t, 5*time.Second, "calls reach both", func() bool {
				got := spread(t, conn, 20, b1, b2)
				return got[b1] > 0 && got[b2] > 0
			})
		})
	}
}
