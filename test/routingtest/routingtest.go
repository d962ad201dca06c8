// Package routingtest is what tests of gRPC routing share: an engine with
// no cluster that routes model → app → addresses, fed by the test, and
// gRPC backends on loopback ports that count their calls. The resolvers'
// own tests and the daemon's (its HTTP API under the remote resolver) use
// it.
package routingtest

import (
	"context"
	"encoding/json"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// Backend is a gRPC server on a loopback port (the health service) that
// counts its calls.
type Backend struct {
	Addr  string // host:port
	Calls atomic.Int64
	srv   *grpc.Server
}

// StartBackend starts a Backend, stopped when t ends.
func StartBackend(t *testing.T) *Backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &Backend{Addr: ln.Addr().String()}
	b.srv = grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		b.Calls.Add(1)
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(b.srv, health.NewServer())
	go func() { _ = b.srv.Serve(ln) }()
	t.Cleanup(b.srv.Stop)
	return b
}

// GracefulStop stops b once its calls in flight are done.
func (b *Backend) GracefulStop() { b.srv.GracefulStop() }

// Chain is Engine's chain: model -> app -> addresses.
var Chain = schema.Chain{Name: "model-to-addresses", Indexes: []string{"model-to-app", "app-to-addresses"}}

// Config is Engine's config, with the given chains: resource "apps"
// (index model-to-app: spec.models → metadata.name) and "backends"
// (index app-to-addresses: metadata.name → addresses).
func Config(chains ...schema.Chain) *schema.Config {
	return &schema.Config{
		Resources: []schema.Resource{
			{Name: "apps", Version: "v1", Resource: "apps",
				Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}}},
			{Name: "backends", Version: "v1", Resource: "backends",
				Indexes: []schema.Index{{Name: "app-to-addresses", Key: "metadata.name", Value: "addresses"}}},
		},
		Chains: chains,
	}
}

// Engine is an engine without a cluster: model -> app -> addresses
// (host:port strings), under the Fake that the test feeds (the engine is
// the Fake's, as users' tests get it).
func Engine(t *testing.T) (*msync.Engine, *metasynctest.Fake) {
	t.Helper()
	return fake(t, Config(Chain))
}

// HintedEngine is Engine whose backends' addresses carry zone hints
// (index app-to-addresses has hints: the "hints" field; see
// SetHintedBackends).
func HintedEngine(t *testing.T) (*msync.Engine, *metasynctest.Fake) {
	t.Helper()
	cfg := Config(Chain)
	cfg.Resources[1].Indexes[0].Hints = "hints"
	return fake(t, cfg)
}

func fake(t *testing.T, cfg *schema.Config) (*msync.Engine, *metasynctest.Fake) {
	t.Helper()
	plan, err := schema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	return f.Engine(), f
}

// SetHintedBackends makes bs the addresses of app on a HintedEngine,
// bs[i] hinted for zones[i]; with no zones, none is hinted.
func SetHintedBackends(t *testing.T, f *metasynctest.Fake, app string, bs []*Backend, zones ...string) {
	t.Helper()
	addrs, hints := []string{}, []string{}
	for i, b := range bs {
		addrs = append(addrs, b.Addr)
		if zones != nil {
			hints = append(hints, b.Addr+"\tzone="+zones[i])
		}
	}
	js, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": app}, "addresses": addrs, "hints": hints})
	if err := f.Apply("backends", string(js)); err != nil {
		t.Fatal(err)
	}
}

// SetApp makes app serve models.
func SetApp(t *testing.T, f *metasynctest.Fake, app string, models ...string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": app}, "spec": map[string]any{"models": models}})
	if err := f.Apply("apps", string(b)); err != nil {
		t.Fatal(err)
	}
}

// SetBackends makes bs the addresses of app.
func SetBackends(t *testing.T, f *metasynctest.Fake, app string, bs ...*Backend) {
	t.Helper()
	addrs := []string{}
	for _, b := range bs {
		addrs = append(addrs, b.Addr)
	}
	js, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": app}, "addresses": addrs})
	if err := f.Apply("backends", string(js)); err != nil {
		t.Fatal(err)
	}
}

// Dial is a round-robin client of target through b, closed when t ends.
func Dial(t *testing.T, target string, b resolver.Builder) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithResolvers(b),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Call makes one call on conn, of at most 2 s.
func Call(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// Within polls cond until it holds, for at most d, and returns how long it
// took.
func Within(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// Spread makes n calls and returns how many reached each of bs.
func Spread(t *testing.T, conn *grpc.ClientConn, n int, bs ...*Backend) map[*Backend]int64 {
	t.Helper()
	before := map[*Backend]int64{}
	for _, b := range bs {
		before[b] = b.Calls.Load()
	}
	for range n {
		if err := Call(conn); err != nil {
			t.Fatalf("call: %v", err)
		}
	}
	out := map[*Backend]int64{}
	for _, b := range bs {
		out[b] = b.Calls.Load() - before[b]
	}
	return out
}
