package xds

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// adsClient opens a raw ADS stream to the test server, with
// go-control-plane's client types.
func adsClient(t *testing.T) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: xdsSrv}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true)
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
