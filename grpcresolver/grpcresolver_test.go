package grpcresolver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/internal/api"
	"github.com/iidp/metasync/internal/feed"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// backend is a gRPC server on a loopback port that counts its calls.
type backend struct {
	addr  string
	calls atomic.Int64
	srv   *grpc.Server
}

func startBackend(t *testing.T) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{addr: ln.Addr().String()}
	b.srv = grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		b.calls.Add(1)
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(b.srv, health.NewServer())
	go func() { _ = b.srv.Serve(ln) }()
	t.Cleanup(b.srv.Stop)
	return b
}

// routingChain is routing's chain: model -> app -> addresses.
var routingChain = schema.Chain{Name: "model-to-addresses", Indexes: []string{"model-to-app", "app-to-addresses"}}

// routingConfig is routing's config, with the given chains.
func routingConfig(chains ...schema.Chain) *schema.Config {
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

// routing is an engine without a cluster: model -> app -> addresses
// (host:port strings), fed by the test.
func routing(t *testing.T) (*msync.Engine, feed.Feeder) {
	t.Helper()
	plan, err := schema.Compile(routingConfig(routingChain))
	if err != nil {
		t.Fatal(err)
	}
	e, f, err := feed.New(plan, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return e.(*msync.Engine), f
}

func setApp(t *testing.T, f feed.Feeder, app string, models ...string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": app}, "spec": map[string]any{"models": models}})
	if err := f.Apply("apps", b); err != nil {
		t.Fatal(err)
	}
}

func setBackends(t *testing.T, f feed.Feeder, app string, bs ...*backend) {
	t.Helper()
	addrs := []string{}
	for _, b := range bs {
		addrs = append(addrs, b.addr)
	}
	js, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": app}, "addresses": addrs})
	if err := f.Apply("backends", js); err != nil {
		t.Fatal(err)
	}
}

func dial(t *testing.T, target string, b resolver.Builder) *grpc.ClientConn {
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

func call(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// within polls cond until it holds, for at most d.
func within(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
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

// spread makes n calls and returns how many reached each of bs.
func spread(t *testing.T, conn *grpc.ClientConn, n int, bs ...*backend) map[*backend]int64 {
	t.Helper()
	before := map[*backend]int64{}
	for _, b := range bs {
		before[b] = b.calls.Load()
	}
	for range n {
		if err := call(conn); err != nil {
			t.Fatalf("call: %v", err)
		}
	}
	out := map[*backend]int64{}
	for _, b := range bs {
		out[b] = b.calls.Load() - before[b]
	}
	return out
}

func TestFollowsTheAnswer(t *testing.T) {
	e, f := routing(t)
	b1, b2, b3 := startBackend(t), startBackend(t), startBackend(t)
	setApp(t, f, "base", "model1")
	setBackends(t, f, "base", b1, b2, b3)
	builder := grpcresolver.NewBuilder(e)
	conn := dial(t, "metasync:///chains/model-to-addresses/model1", builder)

	within(t, 5*time.Second, "every backend gets calls", func() bool {
		got := spread(t, conn, 30, b1, b2, b3)
		return got[b1] > 0 && got[b2] > 0 && got[b3] > 0
	})
	setBackends(t, f, "base", b1, b3) // b2 leaves the answer
	took := within(t, time.Second, "no call reaches a removed backend", func() bool {
		return spread(t, conn, 30, b2)[b2] == 0
	})
	t.Logf("a removed backend stops getting calls within %v", took)
	b4 := startBackend(t)
	setBackends(t, f, "base", b1, b3, b4)
	within(t, time.Second, "an added backend gets calls", func() bool { return spread(t, conn, 30, b4)[b4] > 0 })

	setBackends(t, f, "base") // nobody: fail fast, UNAVAILABLE
	within(t, time.Second, "calls fail with UNAVAILABLE", func() bool {
		return status.Code(call(conn)) == codes.Unavailable
	})
	setBackends(t, f, "base", b2)
	within(t, time.Second, "calls succeed again", func() bool { return call(conn) == nil })

	// The chain follows every step: model1 moves to app "other".
	setBackends(t, f, "other", b3)
	setApp(t, f, "other", "model1") // first claimed by both: the answer is never empty
	setApp(t, f, "base")
	within(t, time.Second, "calls move to the other app", func() bool {
		got := spread(t, conn, 20, b2, b3)
		return got[b2] == 0 && got[b3] == 20
	})
}

func TestBarePortAndTargets(t *testing.T) {
	e, f := routing(t)
	b := startBackend(t)
	_, port, _ := net.SplitHostPort(b.addr)
	js, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": "base"}, "addresses": []string{"127.0.0.1"}})
	if err := f.Apply("backends", js); err != nil {
		t.Fatal(err)
	}
	builder := grpcresolver.NewBuilder(e)
	conn := dial(t, "metasync:///indexes/app-to-addresses/base?port="+port, builder)
	within(t, 5*time.Second, "a bare host takes ?port", func() bool { return call(conn) == nil })

	for _, bad := range []string{
		"metasync:///nope/x/y", "metasync:///chains/unknown/k", "metasync:///indexes/unknown/k",
		"metasync://host/chains/model-to-addresses/k", "metasync:///chains/model-to-addresses/k?port=0",
		"metasync:///chains/model-to-addresses/k?prot=1",
	} {
		c, err := grpc.NewClient(bad, grpc.WithResolvers(builder), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err == nil {
			err = call(c)
			c.Close()
		}
		if err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// TestOneSubscriptionPerTarget: 100 ClientConns on one target share one
// subscription; the last to close ends it.
func TestOneSubscriptionPerTarget(t *testing.T) {
	e, f := routing(t)
	b := startBackend(t)
	setApp(t, f, "base", "model1")
	setBackends(t, f, "base", b)
	builder := grpcresolver.NewBuilder(e)
	var conns []*grpc.ClientConn
	for range 100 {
		c, err := grpc.NewClient("metasync:///chains/model-to-addresses/model1", grpc.WithResolvers(builder),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		c.Connect()
		conns = append(conns, c)
	}
	within(t, 5*time.Second, "100 conns resolved", func() bool { return grpcresolver.Followers(builder) == 1 })
	if n := e.Subscriptions().Open; n != 1 {
		t.Fatalf("%d subscriptions for 100 ClientConns on one target", n)
	}
	for _, c := range conns {
		if err := call(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	within(t, 5*time.Second, "the subscription ends with the last conn", func() bool {
		return e.Subscriptions().Open == 0 && grpcresolver.Followers(builder) == 0
	})
}

// TestRollingReplacement: new backends join before old ones leave, 20
// rounds, under steady load: no call fails.
func TestRollingReplacement(t *testing.T) {
	e, f := routing(t)
	setApp(t, f, "base", "model1")
	current := []*backend{startBackend(t), startBackend(t)}
	setBackends(t, f, "base", current...)
	conn := dial(t, "metasync:///chains/model-to-addresses/model1", grpcresolver.NewBuilder(e))
	within(t, 5*time.Second, "first call", func() bool { return call(conn) == nil })
	var failed, ok atomic.Int64
	stop := make(chan struct{})
	var wg gosync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := call(conn); err != nil {
					failed.Add(1)
					t.Logf("call failed: %v", err)
				} else {
					ok.Add(1)
				}
			}
		})
	}
	for range 20 {
		next := startBackend(t)
		setBackends(t, f, "base", append(current, next)...)
		within(t, 2*time.Second, "the new backend gets calls", func() bool { return next.calls.Load() > 0 })
		old := current[0]
		current = append(current[1:], next)
		setBackends(t, f, "base", current...)
		time.Sleep(50 * time.Millisecond) // let the channel drop it before it stops
		old.srv.GracefulStop()
	}
	close(stop)
	wg.Wait()
	t.Logf("%d calls, %d failed", ok.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Fatalf("%d of %d calls failed during the rolling replacement", failed.Load(), ok.Load()+failed.Load())
	}
}

// TestRemoteBuilder: through a daemon's streams; while the daemon is down
// calls keep going to the last addresses; after it is back the resolver
// resumes, and follows the new daemon's answer.
func TestRemoteBuilder(t *testing.T) {
	e, f := routing(t)
	b1, b2 := startBackend(t), startBackend(t)
	setApp(t, f, "base", "model1")
	setBackends(t, f, "base", b1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	quiet := slog.New(slog.DiscardHandler)
	serve := func(e *msync.Engine, ln net.Listener) *http.Server {
		a := api.New(e, quiet)
		a.SetHeartbeat(200 * time.Millisecond)
		srv := a.HTTPServer(addr, quiet, nil)
		go func() { _ = srv.Serve(ln) }()
		return srv
	}
	srv := serve(e, ln)
	conn := dial(t, "metasync:///chains/model-to-addresses/model1", grpcresolver.NewRemoteBuilder("http://"+addr, grpcresolver.WithLogger(quiet)))
	within(t, 5*time.Second, "calls reach b1", func() bool { return call(conn) == nil && b1.calls.Load() > 0 })
	setBackends(t, f, "base", b2)
	within(t, time.Second, "calls move to b2", func() bool { return spread(t, conn, 10, b1, b2)[b2] == 10 })

	// The daemon stops: calls keep going to the last addresses.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := call(conn); err != nil {
			t.Fatalf("with the daemon down: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A new daemon (a new engine: versions do not carry over) answers b1.
	e2, f2 := routing(t)
	setApp(t, f2, "base", "model1")
	setBackends(t, f2, "base", b1)
	var ln2 net.Listener
	within(t, 5*time.Second, "the port is free again", func() bool {
		ln2, err = net.Listen("tcp", addr)
		return err == nil
	})
	srv2 := serve(e2, ln2)
	defer srv2.Close()
	within(t, 15*time.Second, "the resolver resumes against the new daemon", func() bool {
		return spread(t, conn, 10, b1, b2)[b1] == 10
	})
}

// TestRemoteTokenFile: the remote builder sends the token file's content
// as a bearer token, read again at each connection (tokens rotate).
func TestRemoteTokenFile(t *testing.T) {
	tokens := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens <- r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprintln(w, `{"type":"snapshot","chain":"c","key":"k","values":["127.0.0.1:1"],"version":"x:1:y"}`)
		// the stream ends: the resolver reconnects with the file's new token
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	conn, err := grpc.NewClient("metasync:///chains/c/k", grpc.WithResolvers(grpcresolver.NewRemoteBuilder(srv.URL, grpcresolver.WithTokenFile(file), grpcresolver.WithLogger(quiet))),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Connect()
	if got := <-tokens; got != "Bearer first" {
		t.Fatalf("first connection: Authorization %q", got)
	}
	if err := os.WriteFile(file, []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-tokens:
			if got == "Bearer second" {
				return
			}
		case <-deadline:
			t.Fatal("the rotated token was never sent")
		}
	}
}

// TestTargetRemovedByReload: a reload that removes the chain keeps the
// connection's last addresses (calls go on); a reload that brings it back
// resumes the updates.
func TestTargetRemovedByReload(t *testing.T) {
	e, f := routing(t)
	b1, b2 := startBackend(t), startBackend(t)
	setApp(t, f, "base", "model1")
	setBackends(t, f, "base", b1)
	conn := dial(t, "metasync:///chains/model-to-addresses/model1", grpcresolver.NewBuilder(e))
	within(t, 5*time.Second, "calls reach b1", func() bool { return call(conn) == nil })

	reload := func(chains ...schema.Chain) {
		t.Helper()
		plan, err := schema.Compile(routingConfig(chains...))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Reload(plan); err != nil {
			t.Fatal(err)
		}
	}
	reload()
	if e.HasChain("model-to-addresses") {
		t.Fatal("the chain is still there")
	}
	if got := spread(t, conn, 20, b1); got[b1] != 20 {
		t.Fatalf("after the chain left, b1 got %d of 20 calls", got[b1])
	}
	reload(routingChain)
	setBackends(t, f, "base", b2)
	within(t, 10*time.Second, "calls follow the chain again", func() bool {
		return spread(t, conn, 20, b2)[b2] == 20
	})
}
