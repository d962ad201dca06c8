package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// The four resource types, as a gRPC client asks for them.
const (
	typeListener = "type.googleapis.com/envoy.config.listener.v3.Listener"
	typeRoute    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	typeCluster  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	typeEndpoint = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

var allTypes = []string{typeListener, typeRoute, typeCluster, typeEndpoint}

// targetName is the resource name of target i: the same for its
// Listener, RouteConfiguration, Cluster and assignment.
func targetName(i int) string { return fmt.Sprintf("chains/model-to-endpoints/model-%d", i) }

// tally counts what every client received, for all runs.
type tally struct {
	edsResponses atomic.Int64 // assignment responses
	assignments  atomic.Int64 // assignments in them
	maxResponse  atomic.Int64 // the largest response of any type, bytes
	ended        atomic.Int64 // streams that ended while measured
}

func (t *tally) sized(n int) {
	for {
		m := t.maxResponse.Load()
		if int64(n) <= m || t.maxResponse.CompareAndSwap(m, int64(n)) {
			return
		}
	}
}

// adsClient is one raw ADS client as a gRPC client with xDS follows its
// targets: for each, its Listener, RouteConfiguration, Cluster and
// assignment, every response ACKed, every assignment's marker recorded.
type adsClient struct {
	id      int
	targets []int
	names   []string
	got     *arrivals
	tally   *tally

	// counted: its arrivals count (it held every assignment when the
	// clients had connected).
	counted atomic.Bool
	ready   chan struct{} // closed once it holds every assignment
	mu      sync.Mutex
	seen    map[string]bool
	isReady bool
	ended   atomic.Bool
}

func newClient(id int, targets []int, got *arrivals, t *tally) *adsClient {
	a := &adsClient{id: id, targets: targets, got: got, tally: t, ready: make(chan struct{}), seen: map[string]bool{}}
	for _, i := range targets {
		a.names = append(a.names, targetName(i))
	}
	return a
}

// requests are the client's first requests, one per type.
func (a *adsClient) requests() []*discoveryv3.DiscoveryRequest {
	var out []*discoveryv3.DiscoveryRequest
	for _, typeURL := range allTypes {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: a.names}
		if typeURL == typeListener {
			req.Node = &corev3.Node{Id: fmt.Sprintf("xdsload-%d", a.id)}
		}
		out = append(out, req)
	}
	return out
}

// response records a response received at, and is its ACK.
func (a *adsClient) response(r *discoveryv3.DiscoveryResponse, size int, at time.Time) *discoveryv3.DiscoveryRequest {
	a.tally.sized(size)
	ack := &discoveryv3.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: a.names, ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()}
	if r.GetTypeUrl() != typeEndpoint {
		return ack
	}
	counted := a.counted.Load()
	if counted {
		a.tally.edsResponses.Add(1)
		a.tally.assignments.Add(int64(len(r.GetResources())))
	}
	var names []string
	for _, res := range r.GetResources() {
		cla := &endpointv3.ClusterLoadAssignment{}
		if res.UnmarshalTo(cla) != nil {
			continue
		}
		names = append(names, cla.GetClusterName())
		if !counted {
			continue
		}
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				if s := seqOf(e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()); s >= 0 {
					a.got.saw(s, at, sawXDS)
				}
			}
		}
	}
	a.mu.Lock()
	if !a.isReady {
		for _, n := range names {
			a.seen[n] = true
		}
		if len(a.seen) >= len(a.names) {
			a.isReady, a.seen = true, nil
			close(a.ready)
		}
	}
	a.mu.Unlock()
	return ack
}

func (a *adsClient) end() {
	if !a.ended.Swap(true) && a.counted.Load() {
		a.tally.ended.Add(1)
	}
}

// conn is one connection's clients, over either kind of HTTP/2.
type conn interface{ Close() error }

// dialGroup connects clients over one connection (kind "h2" or "grpc"),
// one ADS stream each, and waits until every one holds its assignments
// or timeout passes; it answers the connection and how many are ready.
func dialGroup(kind, addr string, clients []*adsClient, timeout time.Duration) (conn, int) {
	deadline := time.Now().Add(timeout)
	var c conn
	var err error
	switch kind {
	case "grpc":
		c, err = dialGRPC(addr, clients)
	default:
		c, err = dialH2Clients(addr, clients, timeout)
	}
	if err != nil {
		for _, a := range clients {
			a.end()
		}
		return c, 0
	}
	ready := 0
	for _, a := range clients {
		select {
		case <-a.ready:
			ready++
		case <-time.After(time.Until(deadline)):
		}
	}
	return c, ready
}

// dialGRPC runs clients over one grpc-go ClientConn.
func dialGRPC(addr string, clients []*adsClient) (conn, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		// A response of many assignments may exceed grpc-go's default
		// 4 MiB: the largest is reported.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		return nil, err
	}
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(cc)
	for _, a := range clients {
		go func() {
			defer a.end()
			stream, err := ads.StreamAggregatedResources(context.Background())
			if err != nil {
				return
			}
			for _, req := range a.requests() {
				if stream.Send(req) != nil {
					return
				}
			}
			for {
				r, err := stream.Recv()
				if err != nil {
					return
				}
				if stream.Send(a.response(r, proto.Size(r), time.Now())) != nil {
					return
				}
			}
		}()
	}
	return cc, nil
}

// dialH2Clients runs clients over one connection framed by hand.
func dialH2Clients(addr string, clients []*adsClient, timeout time.Duration) (conn, error) {
	c, err := dialH2(addr, 8<<20, timeout)
	if err != nil {
		return nil, err
	}
	for _, a := range clients {
		s, err := c.open(func(s *h2stream, msg []byte, at time.Time) {
			r := &discoveryv3.DiscoveryResponse{}
			if proto.Unmarshal(msg, r) != nil {
				return
			}
			b, _ := proto.Marshal(a.response(r, len(msg), at))
			_ = s.send(b)
		}, func(error) { a.end() })
		if err != nil {
			c.Close()
			return nil, err
		}
		for _, req := range a.requests() {
			b, _ := proto.Marshal(req)
			if err := s.send(b); err != nil {
				c.Close()
				return nil, err
			}
		}
	}
	return c, nil
}
