package xds

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/iidp/metasync/schema"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// adsClient opens a raw ADS stream to the test server, with
// go-control-plane's client types.
func adsClient(t testing.TB) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := xdsSrv.Transport(nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

// responses reads the stream's responses, from one goroutine (a stream
// takes one reader at a time).
func responses(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) <-chan *discoveryv3.DiscoveryResponse {
	out := make(chan *discoveryv3.DiscoveryResponse, 16)
	go func() {
		defer close(out)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			out <- r
		}
	}()
	return out
}

// recv waits up to d for a response; nil when none came.
func recv(rs <-chan *discoveryv3.DiscoveryResponse, d time.Duration) *discoveryv3.DiscoveryResponse {
	select {
	case r := <-rs:
		return r
	case <-time.After(d):
		return nil
	}
}

// TestNACK: an assignment a client rejects is not sent again until the
// answer changes; the rejection is counted. An unknown target has no
// Listener.
func TestNACK(t *testing.T) {
	a, _ := backend(t)
	route(t, "nack-app", "nack-model", a)
	s := adsClient(t)
	rs := responses(s)
	name := "chains/model-to-endpoints/nack-model"
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	r := recv(rs, 5*time.Second)
	if r == nil || len(r.GetResources()) != 1 {
		t.Fatalf("first assignment: %v", r)
	}
	before := testutil.ToFloat64(xdsSrv.nacks.WithLabelValues("endpoint"))
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}, ResponseNonce: r.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "rejected on purpose"}}); err != nil {
		t.Fatal(err)
	}
	if again := recv(rs, 500*time.Millisecond); again != nil {
		t.Fatalf("the rejected assignment was sent again: %v", again)
	}
	if n := testutil.ToFloat64(xdsSrv.nacks.WithLabelValues("endpoint")) - before; n != 1 {
		t.Errorf("%v NACKs counted, want 1", n)
	}
	b, _ := backend(t)
	route(t, "nack-app", "nack-model", a, b)
	r = recv(rs, 5*time.Second)
	cla := &endpointv3.ClusterLoadAssignment{}
	if r == nil || len(r.GetResources()) != 1 || r.GetResources()[0].UnmarshalTo(cla) != nil || len(cla.GetEndpoints()[0].GetLbEndpoints()) != 2 {
		t.Fatalf("after the answer changed: %v", r)
	}
	// An unknown chain: a listener response without it.
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/nope/k"}}); err != nil {
		t.Fatal(err)
	}
	if r = recv(rs, 5*time.Second); r == nil || r.GetTypeUrl() != TypeListener || len(r.GetResources()) != 0 {
		t.Errorf("listener of an unknown chain: %v", r)
	}
}

// TestReloadAddsAndRestoresTargets: on an open stream, a reload that
// removes a chain removes its Listener, one that brings it back (and adds
// another) answers their Listeners and assignments again.
func TestReloadAddsAndRestoresTargets(t *testing.T) {
	a, _ := backend(t)
	route(t, "rl-app", "rl-model", a)
	s := adsClient(t)
	rs := responses(s)
	known, later := "chains/model-to-endpoints/rl-model", "chains/later/rl-model"
	names := []string{known, later}
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	listeners := func(r *discoveryv3.DiscoveryResponse) int {
		if r == nil || r.GetTypeUrl() != TypeListener {
			return -1
		}
		return len(r.GetResources())
	}
	r := recv(rs, 5*time.Second)
	if listeners(r) != 1 {
		t.Fatalf("listeners at first: %v", r)
	}
	ack := func(r *discoveryv3.DiscoveryResponse) {
		t.Helper()
		if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names, ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()}); err != nil {
			t.Fatal(err)
		}
	}
	ack(r)
	reload := func(config string) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := schema.LoadPlan(path, schema.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := engine.Reload(p); err != nil {
			t.Fatal(err)
		}
	}
	example, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "examples", "appmodel", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := engine.Reload(plan); err != nil {
			t.Error(err)
		}
	})
	body, _, _ := strings.Cut(string(example), "chains:")
	reload(body) // no chain at all
	if r = recv(rs, 5*time.Second); listeners(r) != 0 {
		t.Fatalf("listeners once the chain is removed: %v", r)
	}
	ack(r)
	reload(string(example) + "  - name: later\n    indexes: [model-to-app, service-to-endpoints]\n")
	if r = recv(rs, 5*time.Second); listeners(r) != 2 {
		t.Fatalf("listeners once the chain is back and another added: %v", r)
	}
}

// TestIdleStreamLives: a stream with nothing to push outlives the write
// deadline of its last push (the deadline, a timer, would reset it).
func TestIdleStreamLives(t *testing.T) {
	was := sendTimeout.Load()
	sendTimeout.Store(int64(200 * time.Millisecond))
	t.Cleanup(func() { sendTimeout.Store(was) })
	a, _ := backend(t)
	route(t, "idle-app", "idle-model", a)
	rs := subscribed(t, "chains/model-to-endpoints/idle-model")
	time.Sleep(time.Second)
	b, _ := backend(t)
	route(t, "idle-app", "idle-model", a, b)
	if r := recv(rs, 5*time.Second); r == nil {
		t.Fatal("the idle stream was reset: no push after a second of quiet")
	}
}

// TestAssignmentOneSpellingEach: an address written two ways is one
// endpoint (gRPC rejects an assignment with a duplicate address).
func TestAssignmentOneSpellingEach(t *testing.T) {
	got := &endpointv3.ClusterLoadAssignment{}
	if b := xdsSrv.encodeAnswer("x", parts{}); len(b) == 0 {
		t.Error("an empty answer has no assignment")
	}
	b := xdsSrv.encodeAnswer("x", parts{values: []string{"10.0.0.5:80", "10.0.0.5:080", "[::1]:9", "[0:0::1]:09", "nohost", ":80", "10.0.0.6:0", "10.0.0.7:65536"}})
	if err := proto.Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	if n := len(got.GetEndpoints()[0].GetLbEndpoints()); n != 2 {
		t.Errorf("%d endpoints, want 2: %v", n, got)
	}
}

// TestRelistPushesNoEmptyAnswer: a relist of the same objects pushes
// nothing, and never an assignment without endpoints.
func TestRelistPushesNoEmptyAnswer(t *testing.T) {
	a, _ := backend(t)
	route(t, "relist-app", "relist-model", a)
	rs := subscribed(t, "chains/model-to-endpoints/relist-model")
	for i := 0; i < 20; i++ {
		route(t, "relist-app", "relist-model", a) // the same objects, listed again
	}
	if r := recv(rs, 500*time.Millisecond); r != nil {
		cla := &endpointv3.ClusterLoadAssignment{}
		_ = r.GetResources()[0].UnmarshalTo(cla)
		t.Errorf("relists of the same objects pushed %v", cla)
	}
}

// subscribed opens a raw ADS stream that asks for the assignment name,
// waits for it and ACKs it; the stream's later responses come on rs.
func subscribed(t *testing.T, name string) (rs <-chan *discoveryv3.DiscoveryResponse) {
	t.Helper()
	s := adsClient(t)
	rs = responses(s)
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	r := recv(rs, 5*time.Second)
	if r == nil {
		t.Fatal("no assignment")
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}, ResponseNonce: r.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	return rs
}
