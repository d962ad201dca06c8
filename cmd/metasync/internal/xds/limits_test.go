package xds

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// limitedServer serves a server of the tests' engine with limits l, as
// the daemon serves it (its Transport on its Listener), with metrics of
// its own.
func limitedServer(t *testing.T, l Limits) (s *Server, addr string, reg *prometheus.Registry) {
	t.Helper()
	reg = prometheus.NewRegistry()
	s = New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	s.SetLimits(l)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.Transport(nil)
	go func() { _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { srv.Close() })
	return s, ln.Addr().String(), reg
}

// dialFrom is a gRPC connection to addr from the loopback address from
// (127.0.0.X: each its own caller).
func dialFrom(t *testing.T, addr, from string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// ask opens a stream on conn, asks for the Listeners names and returns
// the first response, or the error that ended the stream.
func ask(t *testing.T, conn *grpc.ClientConn, names ...string) (*discoveryv3.DiscoveryResponse, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names}); err != nil {
		return nil, err
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	type result struct {
		r   *discoveryv3.DiscoveryResponse
		err error
	}
	out := make(chan result, 1)
	go func() {
		r, err := st.Recv()
		out <- result{r, err}
	}()
	select {
	case res := <-out:
		return res.r, res.err
	case <-rctx.Done():
		return nil, rctx.Err()
	}
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
	}
}

// TestStreamsAndNamesPerCaller: a caller's streams and names are
// bounded; another caller is not held back by them.
func TestStreamsAndNamesPerCaller(t *testing.T) {
	route(t, "lim-app", "lim-model", "10.7.0.1:80")
	s, addr, _ := limitedServer(t, Limits{StreamsPerCaller: 2, NamesPerCaller: 5, ConnectionsPerCaller: 64})
	conn := dialFrom(t, addr, "127.0.0.1")
	for i := range 2 {
		if _, err := ask(t, conn, "chains/model-to-endpoints/lim-model"); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	_, err := ask(t, conn, "chains/model-to-endpoints/lim-model")
	wantCode(t, "a third stream of one caller", err, codes.ResourceExhausted)
	if _, err := ask(t, dialFrom(t, addr, "127.0.0.2"), "chains/model-to-endpoints/lim-model"); err != nil {
		t.Errorf("another caller's first stream: %v", err)
	}
	names := make([]string, 6)
	for i := range names {
		names[i] = "chains/model-to-endpoints/m" + strconv.Itoa(i)
	}
	_, err = ask(t, dialFrom(t, addr, "127.0.0.3"), names...)
	wantCode(t, "six names of a caller allowed five", err, codes.ResourceExhausted)
	for _, reason := range []string{refusedStreams, refusedNames} {
		if n := testutil.ToFloat64(s.refused.WithLabelValues(reason)); n != 1 {
			t.Errorf("refusals %s: %v, want 1", reason, n)
		}
	}
	// The refused names were not counted: the caller may ask for fewer.
	if _, err := ask(t, dialFrom(t, addr, "127.0.0.3"), names[:5]...); err != nil {
		t.Errorf("five names after a refusal of six: %v", err)
	}
}

// TestConnectionsPerCaller: one address holds at most
// ConnectionsPerCaller connections with streams, and as many without;
// its flood evicts no one else's, and at the server's connection limit
// a new caller's connection takes the place of an idle one.
func TestConnectionsPerCaller(t *testing.T) {
	route(t, "conn-app", "conn-model", "10.7.0.2:80")
	name := "chains/model-to-endpoints/conn-model"
	s, addr, _ := limitedServer(t, Limits{Connections: 8, ConnectionsPerCaller: 2, StreamsPerCaller: 100})
	for i := range 2 {
		if _, err := ask(t, dialFrom(t, addr, "127.0.0.1"), name); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	_, err := ask(t, dialFrom(t, addr, "127.0.0.1"), name)
	wantCode(t, "a third connection of one caller", err, codes.ResourceExhausted)

	// A flood of connections without streams from one address: beyond
	// two, the oldest are closed.
	var flood []net.Conn
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.5")}}
	for range 10 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, c)
		t.Cleanup(func() { c.Close() })
	}
	closed := 0
	for _, c := range flood {
		// What the server wrote before the close (its settings) is
		// read up to the end.
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.Copy(io.Discard, c); err == nil {
			closed++
		}
	}
	if closed != 8 {
		t.Errorf("%d of 10 connections without a stream from one address closed, want 8", closed)
	}
	// The oldest of them make room: a client of that address gets in
	// all the same.
	if _, err := ask(t, dialFrom(t, addr, "127.0.0.5"), name); err != nil {
		t.Errorf("a client of the flooding address: %v", err)
	}
	// At the limit of 8 (2 streams' + 3 + 2 idle): new callers still get in,
	// in place of connections without a stream idle long enough.
	was := evictAfter
	evictAfter = 100 * time.Millisecond
	t.Cleanup(func() { evictAfter = was })
	time.Sleep(200 * time.Millisecond)
	for _, from := range []string{"127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"} {
		if _, err := ask(t, dialFrom(t, addr, from), name); err != nil {
			t.Errorf("a new caller %s at the connection limit: %v", from, err)
		}
	}
	if n := s.gate.openConnections(); n > 8 {
		t.Errorf("%d connections open, over the limit of 8", n)
	}
}

// TestFirstRequestDeadline: a stream that asks for nothing ends.
func TestFirstRequestDeadline(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{FirstRequest: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dialFrom(t, addr, "127.0.0.1")).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	wantCode(t, "a stream without a request", err, codes.DeadlineExceeded)
	if n := testutil.ToFloat64(s.refused.WithLabelValues(refusedFirstRequest)); n != 1 {
		t.Errorf("refusals first_request: %v, want 1", n)
	}
}

// stalledStream opens an ADS stream on a raw HTTP/2 connection whose
// receive window is 0, and asks for the Listeners names: the server's
// write of its response waits on the client for good.
func stalledStream(t *testing.T, addr string, names []string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", adsPath}, {":authority", addr},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	req, _ := proto.Marshal(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names})
	frame := append([]byte{0, 0, 0, 0, 0}, req...)
	frame[1], frame[2], frame[3], frame[4] = byte(len(req)>>24), byte(len(req)>>16), byte(len(req)>>8), byte(len(req))
	for len(frame) > 0 {
		n := min(len(frame), 16384)
		if err := fr.WriteData(1, false, frame[:n]); err != nil {
			t.Fatal(err)
		}
		frame = frame[n:]
	}
	// Read what the server sends (settings, headers), never a window
	// update: its data waits.
	go func() { _, _ = io.Copy(io.Discard, c) }()
}

// TestStalledClientHoldsNothing: a client that never reads holds its own
// stream only: the status route and the metrics answer at once.
func TestStalledClientHoldsNothing(t *testing.T) {
	route(t, "stall-app", "stall-model", "10.7.0.3:80")
	s, addr, reg := limitedServer(t, DefaultLimits())
	names := make([]string, 500)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/stall-model-%d", i)
	}
	names[0] = "chains/model-to-endpoints/stall-model"
	stalledStream(t, addr, names)
	// Wait until the response is being written: the status shows it
	// sent, the push counter not.
	deadline := time.Now().Add(10 * time.Second)
	for {
		cs := s.Clients()
		if len(cs) == 1 && cs[0].Types["listener"].Sent == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stalled client's response was never under way: %+v", cs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if n := testutil.ToFloat64(s.pushes.WithLabelValues("listener")); n != 0 {
		t.Fatalf("the response to a window of 0 went out (%v pushes): the client does not stall", n)
	}
	h := s.StatusHandler()
	for what, f := range map[string]func(){
		"/v1/xds/clients": func() { h(httptestRecorder{}, &http.Request{}) },
		"/metrics":        func() { _, _ = reg.Gather() },
	} {
		start := time.Now()
		done := make(chan struct{})
		go func() { f(); close(done) }()
		select {
		case <-done:
			t.Logf("%s answered in %v while a client stalls", what, time.Since(start))
		case <-time.After(time.Second):
			t.Errorf("%s waits on a stalled client", what)
		}
	}
}

// httptestRecorder is a ResponseWriter that keeps nothing.
type httptestRecorder struct{}

func (httptestRecorder) Header() http.Header         { return http.Header{} }
func (httptestRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (httptestRecorder) WriteHeader(int)             {}

// askEndpoints opens a stream on conn, asks for the assignments names,
// and returns how many distinct ones came (each as its entry publishes
// it) before a second passes without one.
func askEndpoints(t *testing.T, conn *grpc.ClientConn, names ...string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	rs := make(chan *discoveryv3.DiscoveryResponse)
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			rs <- r
		}
	}()
	got := map[string]bool{}
	for {
		select {
		case r := <-rs:
			for _, res := range r.GetResources() {
				got[string(res.GetValue())] = true
			}
			_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: names, ResponseNonce: r.GetNonce()})
		case <-time.After(time.Second):
			return len(got)
		}
	}
}

// TestAssignmentsLimit: the assignments followed are bounded, and one
// caller may start a quarter of them: another caller's still come.
func TestAssignmentsLimit(t *testing.T) {
	for i := range 3 {
		route(t, fmt.Sprintf("cap-app-%d", i), fmt.Sprintf("cap-model-%d", i), fmt.Sprintf("10.7.1.%d:80", i+1))
	}
	s, addr, _ := limitedServer(t, Limits{Assignments: 8})
	greedy := []string{"chains/model-to-endpoints/cap-model-0", "chains/model-to-endpoints/cap-model-1", "chains/model-to-endpoints/cap-model-2"}
	if n := askEndpoints(t, dialFrom(t, addr, "127.0.0.1"), greedy...); n != 2 {
		t.Errorf("a caller asking for 3 assignments where it may start 2: %d answered", n)
	}
	if n := testutil.ToFloat64(s.refused.WithLabelValues(refusedAssignments)); n < 1 {
		t.Errorf("refusals assignments: %v", n)
	}
	// Another caller follows what the first started, and starts its own.
	if n := askEndpoints(t, dialFrom(t, addr, "127.0.0.2"), greedy...); n != 3 {
		t.Errorf("another caller: %d of 3 answered", n)
	}
	if entries, _ := s.cache.size(); entries != 3 {
		t.Errorf("%d assignments followed, want 3", entries)
	}
}

// TestPartialMessageEnds: a client that announces a message and sends
// it only in part loses its stream within messageTimeout, and with it
// what it sent.
func TestPartialMessageEnds(t *testing.T) {
	was := messageTimeout.Swap(int64(300 * time.Millisecond))
	t.Cleanup(func() { messageTimeout.Store(was) })
	_, addr, _ := limitedServer(t, Limits{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, _ = c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	_ = fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", adsPath}, {":authority", addr},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	// A message of 1 MiB announced, 1 KiB of it sent.
	_ = fr.WriteData(1, false, append([]byte{0, 0, 0x10, 0, 0}, make([]byte, 1024)...))
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	dec := hpack.NewDecoder(4096, nil)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("the stream did not end: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.RSTStreamFrame:
			t.Logf("stream reset after %v: %v", time.Since(start).Round(time.Millisecond), f.ErrCode)
			return
		case *http2.HeadersFrame:
			fields, _ := dec.DecodeFull(f.HeaderBlockFragment())
			for _, hf := range fields {
				if hf.Name == "grpc-status" {
					t.Logf("stream ended after %v: grpc-status %s", time.Since(start).Round(time.Millisecond), hf.Value)
					if hf.Value != "3" {
						t.Errorf("grpc-status %s, want 3 (INVALID_ARGUMENT)", hf.Value)
					}
					return
				}
			}
		}
	}
}
