package xds

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	gosync "sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// The end of a connection and what keeps it honest: a GOAWAY that
// arrives, a graceful shutdown, keepalive, the budgets of PINGs and
// header blocks, and room made by handshakes never finished.

// transportServer serves a Server of its own on a loopback port and
// returns its Transport (closed when t ends).
func transportServer(t *testing.T, l Limits) (*Server, *Transport, string) {
	t.Helper()
	s := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	s.SetLimits(l)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := s.Transport(nil)
	done := make(chan struct{})
	go func() { defer close(done); _ = tr.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { tr.Close(); <-done })
	return s, tr, ln.Addr().String()
}

// untilEnd reads frames until the connection ends and returns the
// GOAWAY's code (-1: none came) and whether it ended cleanly (EOF, not
// a reset).
func untilEnd(r *rawClient, within time.Duration) (goAway int, clean bool) {
	goAway = -1
	_ = r.c.SetReadDeadline(time.Now().Add(within))
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			return goAway, errors.Is(err, io.EOF)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			goAway = int(g.ErrCode)
		}
	}
}

// TestGoAwayArrives: a connection the server ends for a protocol error
// gets its GOAWAY and then the end of the stream, not a reset, even
// when the client sent more than the server read.
func TestGoAwayArrives(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	const n = 200
	var mu gosync.Mutex
	seen, clean := 0, 0
	var wg gosync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := dialRaw(t, addr)
			r.lenient = true
			r.headers(1, adsPath, false)
			// A PING on a stream: a connection error. What follows is
			// more than the server reads before it closes.
			_, _ = r.c.Write([]byte{0, 0, 8, framePing, 0, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8})
			_, _ = r.c.Write(make([]byte, 1000+i*37))
			code, ok := untilEnd(r, 10*time.Second)
			mu.Lock()
			defer mu.Unlock()
			if code == int(http2.ErrCodeProtocol) {
				seen++
			}
			if ok {
				clean++
			}
		})
	}
	wg.Wait()
	if seen != n || clean != n {
		t.Errorf("of %d connections cut for a protocol error, %d read their GOAWAY and %d ended cleanly; want all", n, seen, clean)
	}
}

// TestIdleCloseSendsGoAway: a connection without a stream is closed
// after h2IdleTimeout with a GOAWAY(NO_ERROR) that arrives.
func TestIdleCloseSendsGoAway(t *testing.T) {
	was := h2IdleTimeout
	h2IdleTimeout = 300 * time.Millisecond
	t.Cleanup(func() { h2IdleTimeout = was })
	_, addr, _ := limitedServer(t, Limits{})
	r := dialRaw(t, addr)
	code, clean := untilEnd(r, 5*time.Second)
	if code != int(http2.ErrCodeNo) || !clean {
		t.Errorf("an idle connection ended with GOAWAY %d (clean %v), want NO_ERROR and the end of the stream", code, clean)
	}
}

// TestShutdown: Shutdown sends every connection a GOAWAY(NO_ERROR) and
// ends every open ADS stream UNAVAILABLE, then returns once they are
// gone.
func TestShutdown(t *testing.T) {
	route(t, "shutdown-app", "shutdown-model", "10.9.0.1:80")
	_, tr, addr := transportServer(t, Limits{})
	conn := dialFrom(t, addr, "127.0.0.1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/shutdown-model"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	idle := dialRaw(t, addr)
	idle.lenient = true
	// A stream of its own, so that the idle timer does not close it.
	idle.headers(1, adsPath, false)
	_ = idle.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := idle.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := f.(*http2.HeadersFrame); ok {
			break // the stream is open
		}
	}
	ended := make(chan int, 1)
	go func() { code, _ := untilEnd(idle, 10*time.Second); ended <- code }()

	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	start := time.Now()
	if err := tr.Shutdown(sctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	took := time.Since(start)
	_, err = st.Recv()
	wantCode(t, "an ADS stream at shutdown", err, codes.Unavailable)
	if code := <-ended; code != int(http2.ErrCodeNo) {
		t.Errorf("a connection at shutdown got GOAWAY %d, want NO_ERROR (0)", code)
	}
	if took > 3*time.Second {
		t.Errorf("Shutdown took %v", took)
	}
	t.Logf("Shutdown took %v", took.Round(time.Millisecond))
}

// TestKeepalive: a connection quiet for the keepalive time gets a PING;
// one that acknowledges it stays, one that does not is closed within
// the bound.
func TestKeepalive(t *testing.T) {
	wasTime, wasTimeout := h2KeepaliveTime, h2KeepaliveTimeout
	h2KeepaliveTime, h2KeepaliveTimeout = 300*time.Millisecond, 300*time.Millisecond
	t.Cleanup(func() { h2KeepaliveTime, h2KeepaliveTimeout = wasTime, wasTimeout })
	_, _, addr := transportServer(t, Limits{})

	// Each holds a stream, so that the idle timer does not close it.
	alive := dialRaw(t, addr)
	alive.headers(1, adsPath, false)
	dead := dialRaw(t, addr)
	dead.headers(1, adsPath, false)
	aliveEnded := make(chan struct{})
	go func() {
		defer close(aliveEnded)
		for {
			f, err := alive.fr.ReadFrame()
			if err != nil {
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
				_ = alive.fr.WritePing(true, p.Data)
			}
		}
	}()
	start := time.Now()
	_, _ = untilEnd(dead, 10*time.Second)
	took := time.Since(start)
	// The documented bound, and a second for a machine under load.
	bound := h2KeepaliveTime + h2KeepaliveTimeout + 2*h2KeepaliveTime/6 + time.Second
	if took > bound {
		t.Errorf("a peer that does not acknowledge PINGs was closed after %v, want within %v", took, bound)
	}
	select {
	case <-aliveEnded:
		t.Errorf("a peer that acknowledges PINGs was closed")
	case <-time.After(2 * bound):
	}
	alive.c.Close()
	<-aliveEnded
	t.Logf("a dead peer closed after %v (bound %v)", took.Round(time.Millisecond), bound)
}

// TestPingFloodCut: a client that PINGs without end is cut
// (ENHANCE_YOUR_CALM), though it reads every acknowledgement.
func TestPingFloodCut(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	r := dialRaw(t, addr)
	r.lenient = true
	codes := make(chan int, 1)
	go func() {
		code, _ := untilEnd(r, 10*time.Second)
		codes <- code
	}()
	sent := 0
	for ; sent < 100000; sent++ {
		if err := r.fr.WritePing(false, [8]byte{byte(sent)}); err != nil {
			break
		}
		if sent%100 == 99 {
			time.Sleep(time.Millisecond) // reads as they come
		}
	}
	if code := <-codes; code != int(http2.ErrCodeEnhanceYourCalm) {
		t.Errorf("a PING flood that reads its acknowledgements ended with GOAWAY %d after %d PINGs, want ENHANCE_YOUR_CALM", code, sent)
	}
	t.Logf("cut after %d PINGs sent", sent)
}

// TestHeaderBlocksBounded: header blocks begun and not ended are
// bounded across every connection; the connection that would pass the
// bound is cut, and what the blocks held is given back.
func TestHeaderBlocksBounded(t *testing.T) {
	was := h2MaxBlockBytes
	h2MaxBlockBytes = 1 << 20
	t.Cleanup(func() { h2MaxBlockBytes = was })
	_, tr, addr := transportServer(t, Limits{})
	const conns = 40
	cut := 0
	var rs []*rawClient
	for i := range conns {
		r := dialRaw(t, addr)
		r.lenient = true
		rs = append(rs, r)
		block := make([]byte, 16000)
		_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block})
		for range 3 {
			_ = r.fr.WriteContinuation(1, false, block)
		}
		if held := tr.blockBytes.Load(); held > h2MaxBlockBytes {
			t.Fatalf("after %d connections, header blocks hold %d bytes, over %d", i+1, held, h2MaxBlockBytes)
		}
	}
	for _, r := range rs {
		_ = r.c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				break
			}
			if g, ok := f.(*http2.GoAwayFrame); ok && g.ErrCode == http2.ErrCodeEnhanceYourCalm {
				cut++
				break
			}
		}
	}
	if cut == 0 || cut == conns {
		t.Errorf("%d of %d connections holding 64 KB header blocks were cut under a bound of 1 MiB", cut, conns)
	}
	for _, r := range rs {
		r.c.Close()
	}
	waitFor(t, "the header blocks given back", func() bool { return tr.blockBytes.Load() == 0 })
}

// TestSlowlorisSparesEstablished: connections that never finish their
// HTTP/2 preface, from many addresses, fill the connection limit; a
// caller that holds a connection still gets a new one, in place of one
// of them.
func TestSlowlorisSparesEstablished(t *testing.T) {
	route(t, "loris-app", "loris-model", "10.9.0.2:80")
	name := "chains/model-to-endpoints/loris-model"
	s, addr, _ := limitedServer(t, Limits{Connections: 32, ConnectionsPerCaller: 4, StreamsPerCaller: 100})
	if _, err := ask(t, dialFrom(t, addr, "127.0.0.200"), name); err != nil {
		t.Fatal(err)
	}
	// 8 addresses × 4 partial prefaces: more than the places left.
	for a := range 8 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(10+a))}}
		for range 4 {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			_, _ = c.Write([]byte(http2.ClientPreface[:10]))
		}
	}
	waitFor(t, "the limit filled", func() bool { return s.gate.openConnections() >= 32 })
	for i := range 3 {
		if _, err := ask(t, dialFrom(t, addr, "127.0.0.200"), name); err != nil {
			t.Errorf("connection %d more of a caller that holds one, at a limit filled by unfinished handshakes: %v", i+2, err)
		}
	}
}

// waitFor waits up to 10 s for cond.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
