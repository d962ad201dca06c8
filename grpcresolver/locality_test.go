package grpcresolver_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/iidp/metasync/grpcresolver"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/routingtest"
)

// TestWithLocality: a client that says where it runs gets the backends
// hinted for its zone, and every backend once the hints are gone (through
// a daemon's ?zone=: TestRemoteWithLocality in cmd/metasync/internal/server).
func TestWithLocality(t *testing.T) {
	e, f := routingtest.HintedEngine(t)
	quiet := slog.New(slog.DiscardHandler)
	b1, b2 := routingtest.StartBackend(t), routingtest.StartBackend(t)
	routingtest.SetApp(t, f, "base", "model1")
	bs := []*routingtest.Backend{b1, b2}
	hinted := func(zones ...string) { t.Helper(); routingtest.SetHintedBackends(t, f, "base", bs, zones...) }
	hinted("a", "b")

	at := grpcresolver.WithLocality(msync.Locality{Zone: "b"})
	for _, name := range []string{"in process"} {
		t.Run(name, func(t *testing.T) {
			hinted("a", "b")
			builder := grpcresolver.NewBuilder(e, at, grpcresolver.WithLogger(quiet))
			conn := routingtest.Dial(t, "metasync:///chains/model-to-addresses/model1", builder)
			routingtest.Within(t, 5*time.Second, "calls reach the zone's backend only", func() bool {
				got := routingtest.Spread(t, conn, 20, b1, b2)
				return got[b2] == 20
			})
			hinted() // no hints: every backend
			routingtest.Within(t, 5*time.Second, "calls reach both", func() bool {
				got := routingtest.Spread(t, conn, 20, b1, b2)
				return got[b1] > 0 && got[b2] > 0
			})
		})
	}
}
