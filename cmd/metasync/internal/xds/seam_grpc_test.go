package xds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The same protocol over grpc-go's server, with go-control-plane's
// generated ADS service, and over the server's own HTTP/2: the same
// requests in, the same responses out. The daemon serves over its own
// HTTP/2 alone; grpc-go carries the protocol in this test only.

// grpcADS serves the protocol of s with grpc-go, through the seam as
// any transport does (serveLoop).
type grpcADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	s *Server
}

// StreamAggregatedResources serves one ADS stream.
func (g grpcADS) StreamAggregatedResources(stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	ctx := stream.Context()
	var p Peer
	if pr, ok := peer.FromContext(ctx); ok {
		p.Addr = pr.Addr.String()
	}
	if auth := metadata.ValueFromIncomingContext(ctx, "authorization"); len(auth) > 0 {
		p.Authorization = auth[0]
	}
	recv := func() ([]byte, error) {
		r, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		return proto.Marshal(r)
	}
	send := func(b []byte) error {
		r := &discoveryv3.DiscoveryResponse{}
		if err := proto.Unmarshal(b, r); err != nil {
			return err
		}
		return stream.Send(r)
	}
	err := serveLoop(ctx, g.s, p, recv, send)
	if code, msg := statusOf(err); code != codeOK {
		return status.Error(codes.Code(code), msg)
	}
	return nil
}

// serveGRPC serves s's protocol with grpc-go on a loopback port, until
// the test ends, and returns its address.
func serveGRPC(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, grpcADS{s: s})
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

// serveOwn serves s with its own transport on a loopback port, until
// the test ends, and returns its address.
func serveOwn(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := s.Transport(nil)
	go func() { _ = tr.Serve(ln) }()
	t.Cleanup(func() { tr.Close() })
	return ln.Addr().String()
}

// side is one ADS stream of a comparison, to one of the servers.
type side struct {
	name   string
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	rs     chan *discoveryv3.DiscoveryResponse
	end    chan error // what Recv returned last
	last   map[string]*discoveryv3.DiscoveryResponse
}

// openSide opens a stream to addr with grpc-go's client.
func openSide(t *testing.T, name, addr string) *side {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
	sd := &side{name: name, stream: stream, rs: make(chan *discoveryv3.DiscoveryResponse, 16), end: make(chan error, 1), last: map[string]*discoveryv3.DiscoveryResponse{}}
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				sd.end <- err
				close(sd.rs)
				return
			}
			sd.rs <- r
		}
	}()
	return sd
}

// step is one step of a comparison: a change of the engine's objects
// (nil for none), then a request (nil for none), built from the last
// response of each type on its stream; want responses follow.
type step struct {
	change func(t *testing.T)
	req    func(last map[string]*discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest
	want   int
}

// subscribe asks for names of typeURL, answering no response.
func subscribe(typeURL string, names ...string) func(map[string]*discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
	return func(map[string]*discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
		return &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names}
	}
}

// reply ACKs the last response of typeURL, still asking for names; with
// why, it NACKs it.
func reply(why, typeURL string, names ...string) func(map[string]*discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
	return func(last map[string]*discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
		r := &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names, ResponseNonce: last[typeURL].GetNonce()}
		if why != "" {
			r.ErrorDetail = &rpcstatus.Status{Code: 3, Message: why}
		} else {
			r.VersionInfo = last[typeURL].GetVersionInfo()
		}
		return r
	}
}

// TestSameOverGRPC: each case's requests go to a stream over grpc-go's
// server and to one over the server's own HTTP/2, at the same time; the
// responses of each step, and how each stream ends, are the same.
func TestSameOverGRPC(t *testing.T) {
	own, other := serveOwn(t, xdsSrv), serveGRPC(t, xdsSrv)
	k, unknown := "chains/model-to-endpoints/same-model", "chains/nope/same"
	one := func(t *testing.T) { route(t, "same-app", "same-model", "10.8.0.1:80") }
	two := func(t *testing.T) { route(t, "same-app", "same-model", "10.8.0.1:80", "10.8.0.2:80") }
	cases := []struct {
		name  string
		steps []step
	}{
		{"the four types, each ACKed", []step{
			{one, subscribe(TypeListener, k, unknown), 1}, {nil, reply("", TypeListener, k, unknown), 0},
			{nil, subscribe(TypeRoute, k), 1}, {nil, reply("", TypeRoute, k), 0},
			{nil, subscribe(TypeCluster, k), 1}, {nil, reply("", TypeCluster, k), 0},
			{nil, subscribe(TypeEndpoint, k), 1}, {nil, reply("", TypeEndpoint, k), 0},
		}},
		{"a NACK, then a change", []step{
			{one, subscribe(TypeEndpoint, k), 1}, {nil, reply("rejected on purpose", TypeEndpoint, k), 0},
			{two, nil, 1}, {nil, reply("", TypeEndpoint, k), 0},
		}},
		{"names let go", []step{
			{one, subscribe(TypeListener, k, unknown), 1}, {nil, reply("", TypeListener, k, unknown), 0},
			{nil, subscribe(TypeListener, k), 1}, {nil, subscribe(TypeListener), 1},
			{nil, subscribe(TypeEndpoint, k), 1}, {nil, subscribe(TypeEndpoint), 0},
		}},
		{"pushes of changes", []step{
			{one, subscribe(TypeEndpoint, k), 1}, {nil, reply("", TypeEndpoint, k), 0},
			{two, nil, 1}, {nil, reply("", TypeEndpoint, k), 0},
			{one, nil, 1},
		}},
		{"a name too long ends the stream", []step{
			{nil, subscribe(TypeListener, strings.Repeat("x", MaxNameLength+1)), 0},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sides := []*side{openSide(t, "own HTTP/2", own), openSide(t, "grpc-go", other)}
			for i, st := range tc.steps {
				if st.change != nil {
					st.change(t)
				}
				compareStep(t, fmt.Sprintf("step %d", i+1), sides, st)
			}
			compareEnds(t, sides)
		})
	}
}

// compareStep sends the step's request on each side, and compares the
// responses that follow.
func compareStep(t *testing.T, what string, sides []*side, st step) {
	t.Helper()
	got := make([][]*discoveryv3.DiscoveryResponse, len(sides))
	for _, sd := range sides {
		if st.req != nil {
			if err := sd.stream.Send(st.req(sd.last)); err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("%s, %s: %v", what, sd.name, err)
			}
		}
	}
	for i, sd := range sides {
		for len(got[i]) < st.want {
			r := recv(sd.rs, 5*time.Second)
			if r == nil {
				t.Fatalf("%s, %s: %d responses of %d", what, sd.name, len(got[i]), st.want)
			}
			got[i] = append(got[i], r)
			sd.last[r.GetTypeUrl()] = r
		}
	}
	if st.want == 0 {
		time.Sleep(300 * time.Millisecond)
	}
	for i, sd := range sides {
		select {
		case r, ok := <-sd.rs:
			if ok {
				t.Fatalf("%s, %s: a response more than %d: %v", what, sd.name, st.want, r)
			}
			sd.rs = nil // ended: compareEnds reads why
		default:
		}
		if i > 0 {
			for j := range got[i] {
				if !proto.Equal(got[0][j], got[i][j]) {
					t.Errorf("%s, response %d:\n%s: %v\n%s: %v", what, j+1, sides[0].name, got[0][j], sd.name, got[i][j])
				}
			}
		}
	}
}

// compareEnds ends each side's stream (its side) and compares how the
// server ended it.
func compareEnds(t *testing.T, sides []*side) {
	t.Helper()
	var ends []string
	for _, sd := range sides {
		_ = sd.stream.CloseSend()
		var err error
		select {
		case err = <-sd.end:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the stream did not end", sd.name)
		}
		end := "OK"
		if !errors.Is(err, io.EOF) {
			s := status.Convert(err)
			end = s.Code().String() + ": " + s.Message()
		}
		ends = append(ends, end)
	}
	for i := range ends[1:] {
		if ends[i+1] != ends[0] {
			t.Errorf("ended %s: %s; %s: %s", sides[0].name, ends[0], sides[i+1].name, ends[i+1])
		}
	}
	t.Logf("both ended %s", ends[0])
}
