package xds

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds" // the xds:/// resolver and its balancers

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// The tests' daemon side: an engine of examples/appmodel's config, fed
// without a cluster, served over xDS on a loopback port that the
// bootstrap of grpc-go's own xDS client names (the bootstrap is read
// once per process: one server for every test).
var (
	engine   *msync.Engine
	plan     *schema.Plan // examples/appmodel's
	feeder   *msync.Feed
	xdsSrv   *Server
	resolved resolver.Builder // grpc-go's xds resolver, with the bootstrap
	xdsAddr  string           // where the server listens
)

func TestMain(m *testing.M) {
	var err error
	plan, err = schema.LoadPlan(filepath.Join("..", "..", "..", "..", "examples", "appmodel", "config.yaml"), schema.LoadOptions{})
	if err != nil {
		panic(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	fake, err := metasynctest.New(plan)
	if err != nil {
		panic(err)
	}
	e, f := fake.Engine(), fake.Feed()
	feeder, engine = f, e
	xdsSrv = New(engine.Inspect(), quiet, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := xdsSrv.Transport(nil)
	go func() { _ = srv.Serve(ln) }()
	xdsAddr = ln.Addr().String()
	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"xds-test","locality":{"zone":"zone-a"}}}`, ln.Addr().String())
	// grpc-go reads GRPC_XDS_BOOTSTRAP_CONFIG when it starts: too early
	// for a port picked here. Its resolver takes the same bootstrap.
	if resolved, err = xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap)); err != nil {
		panic(err)
	}
	// What runs now (the engine, the server) stays; what a test starts
	// must be gone once the tests end.
	ignore := goleak.IgnoreCurrent()
	code := m.Run()
	srv.Close()
	if err := goleak.Find(ignore); code == 0 && err != nil {
		fmt.Fprintln(os.Stderr, "goroutines left running by the tests:", err)
		code = 1
	}
	os.Exit(code)
}

// backend is a gRPC health server on a loopback port.
func backend(t testing.TB) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String(), s.Stop
}

// route makes model answer the addresses, through an AppModel of app and
// one EndpointSlice of its Service (port named http).
func route(t testing.TB, app, model string, addrs ...string) {
	t.Helper()
	appModel, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": app, "namespace": "meta-test", "labels": map[string]string{"iidp": "iidp"}},
		"spec": map[string]any{"models": []string{model}}})
	var eps []any
	port := 0
	for _, a := range addrs {
		host, p, _ := net.SplitHostPort(a)
		fmt.Sscan(p, &port)
		eps = append(eps, map[string]any{"addresses": []string{host}, "conditions": map[string]any{"ready": true}})
	}
	// One slice per port: the test's backends listen on ports of their own.
	slices := [][]byte{}
	for i, a := range addrs {
		host, p, _ := net.SplitHostPort(a)
		fmt.Sscan(p, &port)
		s, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": fmt.Sprintf("%s-%d", app, i), "namespace": "meta-test", "labels": map[string]string{"kubernetes.io/service-name": app}},
			"ports":     []any{map[string]any{"name": "http", "port": port}},
			"endpoints": []any{map[string]any{"addresses": []string{host}, "conditions": map[string]any{"ready": true}}}})
		slices = append(slices, s)
	}
	_ = eps
	if err := feeder.Apply("appmodels", appModel); err != nil {
		t.Fatal(err)
	}
	var keep [][]byte
	keep = append(keep, slices...)
	if err := feeder.Replace("endpointslices", keep...); err != nil {
		t.Fatal(err)
	}
}

// calls calls the health service n times through target and counts who
// answered; failures are counted by code.
func calls(t *testing.T, conn *grpc.ClientConn, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	h := healthpb.NewHealthClient(conn)
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var p peer.Peer
		_, err := h.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		cancel()
		if err != nil {
			got["error "+status.Code(err).String()]++
		} else {
			got[p.Addr.String()]++
		}
	}
	return got
}

// eventually retries f for up to 10 s.
func eventually(t *testing.T, what string, f func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGRPCClient: grpc-go's own xDS client, given only a bootstrap that
// names the server, calls a model's backends through xds:///chains/...:
// calls spread over the backends, a removed backend gets none, an added
// one gets calls, an emptied answer fails calls UNAVAILABLE and a new one
// serves again.
func TestGRPCClient(t *testing.T) {
	a, _ := backend(t)
	b, _ := backend(t)
	route(t, "xds-app", "xds-model", a, b)
	conn, err := grpc.NewClient("xds:///chains/model-to-endpoints/xds-model", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolved))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, "calls reach both backends", func() string {
		if got := calls(t, conn, 10); got[a] == 0 || got[b] == 0 {
			return fmt.Sprint(got)
		}
		return ""
	})
	route(t, "xds-app", "xds-model", a)
	eventually(t, "a removed backend gets no call", func() string {
		if got := calls(t, conn, 10); got[a] != 10 {
			return fmt.Sprint(got)
		}
		return ""
	})
	c, _ := backend(t)
	route(t, "xds-app", "xds-model", a, c)
	eventually(t, "an added backend gets calls", func() string {
		if got := calls(t, conn, 10); got[c] == 0 || got[a] == 0 {
			return fmt.Sprint(got)
		}
		return ""
	})
	route(t, "xds-app", "xds-model")
	eventually(t, "an empty answer fails calls", func() string {
		if got := calls(t, conn, 3); got["error "+codes.Unavailable.String()] != 3 {
			return fmt.Sprint(got)
		}
		return ""
	})
	route(t, "xds-app", "xds-model", c)
	eventually(t, "a new answer serves again", func() string {
		if got := calls(t, conn, 5); got[c] != 5 {
			return fmt.Sprint(got)
		}
		return ""
	})
}

// TestClientsStatus: the status names each connected client's node and,
// per type, what it asked for and acknowledged.
func TestClientsStatus(t *testing.T) {
	a, _ := backend(t)
	route(t, "status-app", "status-model", a)
	conn, err := grpc.NewClient("xds:///chains/model-to-endpoints/status-model", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolved))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, "a call answered", func() string {
		if got := calls(t, conn, 1); got[a] != 1 {
			return fmt.Sprint(got)
		}
		return ""
	})
	eventually(t, "the client's status", func() string {
		for _, c := range xdsSrv.Clients() {
			eds := c.Types["endpoint"]
			if c.Node == "xds-test" && c.Zone == "zone-a" && slices.Contains(eds.Names, "chains/model-to-endpoints/status-model") && eds.Acked != "" && eds.Acked == eds.Sent {
				return ""
			}
		}
		return fmt.Sprintf("%+v", xdsSrv.Clients())
	})
}

// TestLocalityPriorities: for a client whose bootstrap says zone-a, the
// endpoints hinted for zone-a are priority 0 and the others priority 1:
// calls go to its zone, and fail over to the other when its zone's
// backend stops.
func TestLocalityPriorities(t *testing.T) {
	near, stopNear := backend(t)
	far, _ := backend(t)
	appModel, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": "zone-app", "namespace": "meta-test", "labels": map[string]string{"iidp": "iidp"}},
		"spec": map[string]any{"models": []string{"zone-model"}}})
	var slices [][]byte
	for i, b := range []struct{ addr, zone string }{{near, "zone-a"}, {far, "zone-b"}} {
		host, p, _ := net.SplitHostPort(b.addr)
		var port int
		fmt.Sscan(p, &port)
		s, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": fmt.Sprintf("zone-app-%d", i), "namespace": "meta-test", "labels": map[string]string{"kubernetes.io/service-name": "zone-app"}},
			"ports": []any{map[string]any{"name": "http", "port": port}},
			"endpoints": []any{map[string]any{"addresses": []string{host}, "conditions": map[string]any{"ready": true}, "zone": b.zone,
				"hints": map[string]any{"forZones": []any{map[string]any{"name": b.zone}}}}}})
		slices = append(slices, s)
	}
	if err := feeder.Apply("appmodels", appModel); err != nil {
		t.Fatal(err)
	}
	if err := feeder.Replace("endpointslices", slices...); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///chains/model-to-endpoints/zone-model", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolved))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, "calls stay in the client's zone", func() string {
		if got := calls(t, conn, 10); got[near] != 10 {
			return fmt.Sprint(got)
		}
		return ""
	})
	stopNear()
	eventually(t, "calls fail over to the other zone", func() string {
		if got := calls(t, conn, 5); got[far] != 5 {
			return fmt.Sprint(got)
		}
		return ""
	})
}

// TestRollingReplacement: a make-before-break rollout (a new backend
// added, then an old one removed, one at a time) fails no call.
func TestRollingReplacement(t *testing.T) {
	old1, _ := backend(t)
	old2, _ := backend(t)
	route(t, "roll-app", "roll-model", old1, old2)
	conn, err := grpc.NewClient("xds:///chains/model-to-endpoints/roll-model", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolved))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, "both old backends answer", func() string {
		if got := calls(t, conn, 10); got[old1] == 0 || got[old2] == 0 {
			return fmt.Sprint(got)
		}
		return ""
	})
	new1, _ := backend(t)
	new2, _ := backend(t)
	steps := [][]string{{old1, old2, new1}, {old2, new1}, {old2, new1, new2}, {new1, new2}}
	failed := 0
	for _, step := range steps {
		route(t, "roll-app", "roll-model", step...)
		for k, n := range calls(t, conn, 40) {
			if strings.HasPrefix(k, "error") {
				failed += n
			}
		}
	}
	if failed != 0 {
		t.Errorf("%d calls failed during the rollout", failed)
	}
	eventually(t, "after the rollout, only the new backends answer", func() string {
		if got := calls(t, conn, 10); got[new1]+got[new2] != 10 {
			return fmt.Sprint(got)
		}
		return ""
	})
}
