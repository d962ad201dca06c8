package grpcresolver_test

import (
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
	"google.golang.org/grpc/status"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/test/routingtest"
)

func TestFollowsTheAnswer(t *testing.T) {
	e, f := routingtest.Engine(t)
	b1, b2, b3 := routingtest.StartBackend(t), routingtest.StartBackend(t), routingtest.StartBackend(t)
	routingtest.SetApp(t, f, "base", "model1")
	routingtest.SetBackends(t, f, "base", b1, b2, b3)
	builder := grpcresolver.NewBuilder(e)
	conn := routingtest.Dial(t, "metasync:///chains/model-to-addresses/model1", builder)

	routingtest.Within(t, 5*time.Second, "every backend gets calls", func() bool {
		got := routingtest.Spread(t, conn, 30, b1, b2, b3)
		return got[b1] > 0 && got[b2] > 0 && got[b3] > 0
	})
	routingtest.SetBackends(t, f, "base", b1, b3) // b2 leaves the answer
	took := routingtest.Within(t, time.Second, "no call reaches a removed backend", func() bool {
		return routingtest.Spread(t, conn, 30, b2)[b2] == 0
	})
	t.Logf("a removed backend stops getting calls within %v", took)
	b4 := routingtest.StartBackend(t)
	routingtest.SetBackends(t, f, "base", b1, b3, b4)
	routingtest.Within(t, time.Second, "an added backend gets calls", func() bool { return routingtest.Spread(t, conn, 30, b4)[b4] > 0 })

	routingtest.SetBackends(t, f, "base") // nobody: fail fast, UNAVAILABLE
	routingtest.Within(t, time.Second, "calls fail with UNAVAILABLE", func() bool {
		return status.Code(routingtest.Call(conn)) == codes.Unavailable
	})
	routingtest.SetBackends(t, f, "base", b2)
	routingtest.Within(t, time.Second, "calls succeed again", func() bool { return routingtest.Call(conn) == nil })

	// The chain follows every step: model1 moves to app "other".
	routingtest.SetBackends(t, f, "other", b3)
	routingtest.SetApp(t, f, "other", "model1") // first claimed by both: the answer is never empty
	routingtest.SetApp(t, f, "base")
	routingtest.Within(t, time.Second, "calls move to the other app", func() bool {
		got := routingtest.Spread(t, conn, 20, b2, b3)
		return got[b2] == 0 && got[b3] == 20
	})
}

func TestBarePortAndTargets(t *testing.T) {
	e, f := routingtest.Engine(t)
	b := routingtest.StartBackend(t)
	_, port, _ := net.SplitHostPort(b.Addr)
	js, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": "base"}, "addresses": []string{"127.0.0.1"}})
	if err := f.Apply("backends", string(js)); err != nil {
		t.Fatal(err)
	}
	builder := grpcresolver.NewBuilder(e)
	conn := routingtest.Dial(t, "metasync:///indexes/app-to-addresses/base?port="+port, builder)
	routingtest.Within(t, 5*time.Second, "a bare host takes ?port", func() bool { return routingtest.Call(conn) == nil })

	for _, bad := range []string{
		"metasync:///nope/x/y", "metasync:///chains/unknown/k", "metasync:///indexes/unknown/k",
		"metasync://host/chains/model-to-addresses/k", "metasync:///chains/model-to-addresses/k?port=0",
		"metasync:///chains/model-to-addresses/k?prot=1",
	} {
		c, err := grpc.NewClient(bad, grpc.WithResolvers(builder), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err == nil {
			err = routingtest.Call(c)
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
	e, f := routingtest.Engine(t)
	b := routingtest.StartBackend(t)
	routingtest.SetApp(t, f, "base", "model1")
	routingtest.SetBackends(t, f, "base", b)
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
	routingtest.Within(t, 5*time.Second, "100 conns resolved", func() bool { return grpcresolver.Followers(builder) == 1 })
	if n := e.Inspect().Subscriptions().Open; n != 1 {
		t.Fatalf("%d subscriptions for 100 ClientConns on one target", n)
	}
	for _, c := range conns {
		if err := routingtest.Call(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	routingtest.Within(t, 5*time.Second, "the subscription ends with the last conn", func() bool {
		return e.Inspect().Subscriptions().Open == 0 && grpcresolver.Followers(builder) == 0
	})
}

// TestRollingReplacement: new backends join before old ones leave, 20
// rounds, under steady load: no call fails.
func TestRollingReplacement(t *testing.T) {
	e, f := routingtest.Engine(t)
	routingtest.SetApp(t, f, "base", "model1")
	current := []*routingtest.Backend{routingtest.StartBackend(t), routingtest.StartBackend(t)}
	routingtest.SetBackends(t, f, "base", current...)
	conn := routingtest.Dial(t, "metasync:///chains/model-to-addresses/model1", grpcresolver.NewBuilder(e))
	routingtest.Within(t, 5*time.Second, "first call", func() bool { return routingtest.Call(conn) == nil })
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
				if err := routingtest.Call(conn); err != nil {
					failed.Add(1)
					t.Logf("call failed: %v", err)
				} else {
					ok.Add(1)
				}
			}
		})
	}
	for range 20 {
		next := routingtest.StartBackend(t)
		routingtest.SetBackends(t, f, "base", append(current, next)...)
		routingtest.Within(t, 2*time.Second, "the new backend gets calls", func() bool { return next.Calls.Load() > 0 })
		old := current[0]
		current = append(current[1:], next)
		routingtest.SetBackends(t, f, "base", current...)
		time.Sleep(50 * time.Millisecond) // let the channel drop it before it stops
		old.GracefulStop()
	}
	close(stop)
	wg.Wait()
	t.Logf("%d calls, %d failed", ok.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Fatalf("%d of %d calls failed during the rolling replacement", failed.Load(), ok.Load()+failed.Load())
	}
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
	e, f := routingtest.Engine(t)
	b1, b2 := routingtest.StartBackend(t), routingtest.StartBackend(t)
	routingtest.SetApp(t, f, "base", "model1")
	routingtest.SetBackends(t, f, "base", b1)
	conn := routingtest.Dial(t, "metasync:///chains/model-to-addresses/model1", grpcresolver.NewBuilder(e))
	routingtest.Within(t, 5*time.Second, "calls reach b1", func() bool { return routingtest.Call(conn) == nil })

	reload := func(chains ...schema.Chain) {
		t.Helper()
		plan, err := schema.Compile(routingtest.Config(chains...))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Reload(plan); err != nil {
			t.Fatal(err)
		}
	}
	reload()
	if e.Inspect().HasChain("model-to-addresses") {
		t.Fatal("the chain is still there")
	}
	if got := routingtest.Spread(t, conn, 20, b1); got[b1] != 20 {
		t.Fatalf("after the chain left, b1 got %d of 20 calls", got[b1])
	}
	reload(routingtest.Chain)
	routingtest.SetBackends(t, f, "base", b2)
	routingtest.Within(t, 10*time.Second, "calls follow the chain again", func() bool {
		return routingtest.Spread(t, conn, 20, b2)[b2] == 20
	})
}
