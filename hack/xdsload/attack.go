package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// attack measures o.attack against s.
func attack(o options, s *server) error {
	fmt.Printf("\n== %s (%s): %s\n", s.name, s.cmd.Path, o.attack)
	time.Sleep(2 * time.Second)
	switch o.attack {
	case "idle-streams":
		return idleStreams(o, s)
	case "stall":
		return stall(s)
	default:
		return manyStreams(o, s)
	}
}

// state prints the server's goroutines, resident memory and xDS
// clients.
func (s *server) state(when string) (goroutines float64, resident uint64) {
	goroutines, resident = s.value("go_goroutines"), rss(s.pid)
	fmt.Printf("%s: %.0f goroutines, %s resident, %s_clients %s\n", when, goroutines, mib(resident), s.prefix[:len(s.prefix)-1], s.metric(s.prefix+"clients"))
	return goroutines, resident
}

// idleStreams opens o.attackConns connections with one ADS stream each
// that sends nothing, then times a legitimate client.
func idleStreams(o options, s *server) error {
	s.state("before")
	var (
		mu       sync.Mutex
		conns    []*h2conn
		accepted atomic.Int64
		wg       sync.WaitGroup
	)
	t0 := time.Now()
	sem := make(chan struct{}, 64)
	for range o.attackConns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := dialH2(s.xds, 65535, 5*time.Second)
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if _, err := c.open(func(*h2stream, []byte, time.Time) {}, nil); err != nil {
				return
			}
			select {
			case <-c.settled:
				accepted.Add(1)
			case <-time.After(5 * time.Second):
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	fmt.Printf("%d connections open, %d answered by the server's SETTINGS, each with one stream that sends nothing, in %s\n",
		len(conns), accepted.Load(), time.Since(t0).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	s.state("with them")
	d, err := firstResponse(s.xds, 20*time.Second)
	if err != nil {
		fmt.Printf("a legitimate client (grpc-go): no response in %s (%v)\n", d.Round(time.Millisecond), err)
	} else {
		fmt.Printf("a legitimate client (grpc-go): first response in %s\n", d.Round(time.Millisecond))
	}
	m := timeGet("http://"+s.http+"/metrics", 20*time.Second)
	fmt.Printf("GET /metrics meanwhile: %s\n", m)
	// Does the server ever let them go?
	time.Sleep(40 * time.Second)
	open := 0
	for _, c := range conns {
		select {
		case <-c.done:
		default:
			open++
		}
	}
	fmt.Printf("after 40 s more: %d of the %d connections still open\n", open, len(conns))
	return nil
}

// stall asks for a Listener over a stream whose receive window is 0,
// then times the server's HTTP routes and a legitimate client.
func stall(s *server) error {
	s.state("before")
	c, err := dialH2(s.xds, 0, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	ended := make(chan time.Time, 1)
	st, err := c.open(func(*h2stream, []byte, time.Time) {}, func(err error) {
		ended <- time.Now()
	})
	if err != nil {
		return err
	}
	req, _ := proto.Marshal(&discoveryv3.DiscoveryRequest{TypeUrl: typeListener, ResourceNames: []string{targetName(0)}, Node: &corev3.Node{Id: "xdsload-stalled"}})
	if err := st.send(req); err != nil {
		return err
	}
	t0 := time.Now()
	fmt.Println("a client with an HTTP/2 receive window of 0 asked for a Listener")
	time.Sleep(time.Second)
	var wg sync.WaitGroup
	var metrics, status, client string
	wg.Go(func() { metrics = timeGet("http://"+s.http+"/metrics", 60*time.Second) })
	if s.name == "metasync" {
		wg.Go(func() { status = timeGet("http://"+s.http+"/v1/xds/clients", 60*time.Second) })
	}
	wg.Go(func() {
		d, err := firstResponse(s.xds, 60*time.Second)
		client = d.Round(time.Millisecond).String()
		if err != nil {
			client = "none in " + client + " (" + err.Error() + ")"
		}
	})
	wg.Wait()
	fmt.Printf("1 s after its request, at once: GET /metrics %s", metrics)
	if s.name == "metasync" {
		fmt.Printf("; GET /v1/xds/clients %s", status)
	}
	fmt.Printf("; a legitimate client's first response %s\n", client)
	select {
	case at := <-ended:
		fmt.Printf("the stalled stream was ended by the server %s after its request\n", at.Sub(t0).Round(time.Millisecond))
	case <-time.After(time.Second):
		fmt.Printf("the stalled stream is still open %s after its request\n", time.Since(t0).Round(time.Second))
	}
	fmt.Printf("then: GET /metrics %s\n", timeGet("http://"+s.http+"/metrics", 60*time.Second))
	return nil
}

// manyStreams opens o.attackStreams streams from one process, 4 to a
// connection, each asking for 1,000 names of every type.
func manyStreams(o options, s *server) error {
	g0, r0 := s.state("before")
	t := &tally{}
	var targets []int
	for i := range 1000 {
		targets = append(targets, i)
	}
	var clients []*adsClient
	for i := range o.attackStreams {
		clients = append(clients, newClient(i, targets, nil, t))
	}
	t0 := time.Now()
	var conns []conn
	for g := 0; g < len(clients); g += 4 {
		c, _ := dialGroup("h2", s.xds, clients[g:min(g+4, len(clients))], 0)
		if c != nil {
			conns = append(conns, c)
		}
	}
	// Until every stream holds an assignment of each name (an unknown
	// key of a chain has one without endpoints in metasync, none in the
	// peer), at most 60 s.
	deadline := time.Now().Add(60 * time.Second)
	ready := 0
	for _, a := range clients {
		select {
		case <-a.ready:
			ready++
		case <-time.After(time.Until(deadline)):
		}
	}
	fmt.Printf("%d streams on %d connections, each asking for 1000 names of each type (model-0 to model-999, of which %d exist); %d streams held an assignment of every name after %s\n",
		len(clients), len(conns), min(o.targets, 1000), ready, time.Since(t0).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	g1, r1 := s.state("with them")
	fmt.Printf("per stream: %.0f goroutines, %s resident; per name followed: %.2f goroutines, %s\n",
		(g1-g0)/float64(len(clients)), kib((r1-min(r1, r0))/uint64(len(clients))),
		(g1-g0)/float64(len(clients)*1000), kib((r1-min(r1, r0))/uint64(len(clients)*1000)))
	if s.name == "metasync" {
		fmt.Printf("metasync_xds_resources{type=\"endpoint\"} %s\n", s.metric(`metasync_xds_resources{type="endpoint"}`))
	}
	fmt.Printf("largest response a stream received: %s\n", kib(uint64(t.maxResponse.Load())))
	for _, c := range conns {
		c.Close()
	}
	time.Sleep(3 * time.Second)
	s.state("3 s after they closed")
	return nil
}

// firstResponse times a grpc-go ADS client asking for the four
// resources of target 0, to its first response; at most wait.
func firstResponse(addr string, wait time.Duration) (time.Duration, error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx, grpc.WaitForReady(true))
	if err != nil {
		return time.Since(t0), err
	}
	a := newClient(0, []int{0}, nil, &tally{})
	a.id = os.Getpid()
	for _, req := range a.requests() {
		if err := stream.Send(req); err != nil {
			return time.Since(t0), err
		}
	}
	if _, err := stream.Recv(); err != nil {
		return time.Since(t0), err
	}
	return time.Since(t0), nil
}

// timeGet times a GET to its answer's end, at most wait.
func timeGet(url string, wait time.Duration) string {
	t0 := time.Now()
	c := http.Client{Timeout: wait}
	resp, err := c.Get(url)
	if err != nil {
		return fmt.Sprintf("failed after %s (%v)", time.Since(t0).Round(time.Millisecond), err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return fmt.Sprintf("%d, %d bytes in %s", resp.StatusCode, n, time.Since(t0).Round(time.Millisecond))
}
