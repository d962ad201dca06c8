package xds

// The lives of streams and connections of the server's HTTP/2: resets,
// closes, timeouts and faults, and that nothing is left behind.

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// serverState is what a server holds of its clients, "" when nothing.
func serverState(s *Server) string {
	var out []string
	if cs := s.Clients(); len(cs) > 0 {
		out = append(out, fmt.Sprintf("%d clients", len(cs)))
	}
	if n := testutil.ToFloat64(s.clients); n != 0 {
		out = append(out, fmt.Sprintf("gauge %v", n))
	}
	g := &s.gate
	g.mu.Lock()
	if held := g.pool.Held(); len(g.streams) > 0 || len(g.names) > 0 || held != "" {
		out = append(out, fmt.Sprintf("gate streams %v names %v %s", g.streams, g.names, held))
	}
	g.mu.Unlock()
	s.cache.mu.Lock()
	if len(s.cache.entries) > 0 {
		out = append(out, fmt.Sprintf("%d cache entries", len(s.cache.entries)))
	}
	s.cache.mu.Unlock()
	return strings.Join(out, "; ")
}

// TestChaosLeavesNothing: clients that misbehave in many ways, then
// leave; the server holds nothing of them after.
func TestChaosLeavesNothing(t *testing.T) {
	route(t, "chaos-app", "chaos-model", "10.7.0.9:80")
	eds := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{"chains/model-to-endpoints/chaos-model"}})
	lds := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/chaos-model"}})
	baseline := runtime.NumGoroutine()
	s, addr, _ := limitedServer(t, DefaultLimits())
	drain := func(r *rawClient) {
		go func() {
			for {
				if _, err := r.fr.ReadFrame(); err != nil {
					return
				}
			}
		}()
	}
	behaviours := []func(r *rawClient){
		func(r *rawClient) { // rapid reset
			drain(r)
			for id := uint32(1); id < 400; id += 2 {
				r.headers(id, adsPath, false)
				_ = r.fr.WriteData(id, false, eds)
				_ = r.fr.WriteRSTStream(id, http2.ErrCodeCancel)
			}
		},
		func(r *rawClient) { // reset while the response is queued
			_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			drain(r)
			for id := uint32(1); id < 40; id += 2 {
				r.headers(id, adsPath, false)
				_ = r.fr.WriteData(id, false, eds)
				_ = r.fr.WriteData(id, false, lds)
				time.Sleep(5 * time.Millisecond)
				_ = r.fr.WriteRSTStream(id, http2.ErrCodeCancel)
			}
		},
		func(r *rawClient) { // stalled, then gone
			_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			drain(r)
			for id := uint32(1); id < 8; id += 2 {
				r.headers(id, adsPath, false)
				_ = r.fr.WriteData(id, false, eds)
				_ = r.fr.WriteData(id, false, lds)
				_ = r.fr.WriteData(id, false, eds[:7])
			}
			time.Sleep(20 * time.Millisecond)
		},
		func(r *rawClient) { // half-closes, windows shrink and grow
			drain(r)
			for id := uint32(1); id < 100; id += 2 {
				r.headers(id, adsPath, false)
				_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(id % 3 * 100)})
				_ = r.fr.WriteData(id, id%4 == 1, eds)
				_ = r.fr.WriteWindowUpdate(id, 50)
				if id%4 == 3 {
					_ = r.fr.WriteData(id, true, lds)
				}
				_ = r.fr.WriteWindowUpdate(0, 100)
			}
			time.Sleep(20 * time.Millisecond)
		},
		func(r *rawClient) { // bad things on the stream
			drain(r)
			r.headers(1, adsPath, false)
			_ = r.fr.WriteData(1, false, eds)
			_ = r.fr.WriteData(1, false, []byte{9, 9, 9, 9, 9, 9})
			r.headers(3, adsPath, true)
			_ = r.fr.WriteData(3, false, eds) // after END_STREAM
			r.headers(5, adsPath, false)
			_ = r.fr.WriteData(5, false, eds)
			r.headers(5, adsPath, true) // trailers
			time.Sleep(20 * time.Millisecond)
		},
	}
	var wg sync.WaitGroup
	for round := range 3 {
		for i, b := range behaviours {
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := dialRaw(t, addr)
					b(r)
					if (round+i)%2 == 0 {
						time.Sleep(50 * time.Millisecond)
					}
					r.c.Close()
				}()
			}
		}
		wg.Wait()
	}
	eventually(t, "the server lets go of the clients", func() string { return serverState(s) })
	var n int
	for range 100 {
		if n = runtime.NumGoroutine(); n <= baseline+3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n > baseline+3 {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines, %d before:\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
	}
}

// TestNoFramesAfterOwnReset: when the server resets a stream (DATA after
// the client's END_STREAM; a second HEADERS, trailers, on an open
// stream), it writes nothing more on it, and lets its state go.
func TestNoFramesAfterOwnReset(t *testing.T) {
	lds := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/zombie"}})
	for _, c := range []struct {
		what string
		send func(r *rawClient)
	}{
		{"DATA after END_STREAM", func(r *rawClient) {
			_ = r.fr.WriteData(1, true, lds)
			time.Sleep(100 * time.Millisecond)
			_ = r.fr.WriteData(1, false, lds)
		}},
		{"trailers on an open stream", func(r *rawClient) {
			_ = r.fr.WriteData(1, false, lds)
			time.Sleep(100 * time.Millisecond)
			r.headers(1, adsPath, true)
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			s, addr, _ := limitedServer(t, Limits{})
			// A window of 0: the response waits, the stream stays open.
			r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			r.headers(1, adsPath, false)
			c.send(r)
			var rst http2.ErrCode
			_ = r.c.SetReadDeadline(time.Now().Add(3 * time.Second))
			for rst == 0 {
				f, err := r.fr.ReadFrame()
				if err != nil {
					t.Fatalf("no RST_STREAM: %v", err)
				}
				if f, ok := f.(*http2.RSTStreamFrame); ok {
					rst = f.ErrCode
				}
			}
			t.Logf("the server reset stream 1: %v; clients now %d", rst, len(s.Clients()))
			// The client, its stream closed, grants window on the connection.
			_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535})
			_ = r.c.SetReadDeadline(time.Now().Add(time.Second))
			for {
				f, err := r.fr.ReadFrame()
				if err != nil {
					break
				}
				switch f := f.(type) {
				case *http2.DataFrame, *http2.HeadersFrame:
					t.Errorf("after its RST_STREAM %v the server wrote %T on stream %d", rst, f, f.Header().StreamID)
				}
			}
			if cs := s.Clients(); len(cs) != 0 {
				t.Errorf("the stream reset by the server still counts as a client: %d", len(cs))
			}
		})
	}
}

// TestCloseDuringActivity: Transport.Close while clients stream, stall,
// reset and connect; nothing is left after.
func TestCloseDuringActivity(t *testing.T) {
	route(t, "close-app", "close-model", "10.7.0.10:80")
	eds := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{"chains/model-to-endpoints/close-model"}})
	baseline := runtime.NumGoroutine()
	for round := range 5 {
		s := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		s.SetLimits(DefaultLimits())
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var cfg *tls.Config
		if round%2 == 1 {
			cfg, _ = selfSigned(t)
		}
		srv := s.Transport(cfg)
		go func() { _ = srv.Serve(s.Listener(ln)) }()
		addr := ln.Addr().String()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.Dial("tcp", addr)
					if err != nil {
						continue
					}
					var nc net.Conn = c
					if cfg != nil {
						tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
						_ = tc.SetDeadline(time.Now().Add(2 * time.Second))
						if tc.Handshake() != nil {
							c.Close()
							continue
						}
						nc = tc
					}
					_, _ = nc.Write([]byte(http2.ClientPreface))
					fr := http2.NewFramer(nc, nc)
					if i%2 == 0 {
						_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
					} else {
						_ = fr.WriteSettings()
					}
					r := &rawClient{t: t, c: nc, fr: fr, lenient: true}
					go func() {
						for {
							if _, err := fr.ReadFrame(); err != nil {
								return
							}
						}
					}()
					for id := uint32(1); id < 9; id += 2 {
						r.headers(id, adsPath, false)
						_ = fr.WriteData(id, false, eds)
						if i%3 == 0 {
							_ = fr.WriteRSTStream(id, http2.ErrCodeCancel)
						}
					}
					time.Sleep(time.Duration(i) * 3 * time.Millisecond)
					if i%4 == 0 {
						nc.Close()
					}
					select {
					case <-stop:
						nc.Close()
						return
					case <-time.After(10 * time.Millisecond):
					}
				}
			}()
		}
		time.Sleep(300 * time.Millisecond)
		srv.Close()
		close(stop)
		wg.Wait()
		eventually(t, "the server lets go of the clients", func() string { return serverState(s) })
	}
	var n int
	for range 100 {
		if n = runtime.NumGoroutine(); n <= baseline+3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n > baseline+3 {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines, %d before:\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
	}
}

// TestResetStreamEndsItsReview: a review of access (the Authorizer,
// which waits on the request's context as auth.TokenAuth's decide does)
// in flight for a stream the client reset, or whose connection closed,
// ends with it: the stream's state goes at once (x/net cancelled the
// request's context on RST_STREAM and on the connection's end).
func TestResetStreamEndsItsReview(t *testing.T) {
	const review = 5 * time.Second
	for _, how := range []string{"RST_STREAM", "connection closed"} {
		t.Run(how, func(t *testing.T) {
			s := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
			inFlight := make(chan struct{}, 16)
			s.SetAuthorizer(func(r *http.Request, thing string) (string, int, string) {
				if thing == "" {
					return "u", 0, ""
				}
				inFlight <- struct{}{}
				select { // a slow review
				case <-r.Context().Done():
					return "u", http.StatusServiceUnavailable, "request ended before the review"
				case <-time.After(review):
					return "u", 0, ""
				}
			})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := s.Transport(nil)
			go func() { _ = srv.Serve(s.Listener(ln)) }()
			t.Cleanup(func() { srv.Close() })
			r := dialRaw(t, ln.Addr().String())
			r.headers(1, adsPath, false)
			_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/review"}}))
			<-inFlight
			if how == "RST_STREAM" {
				_ = r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			} else {
				r.c.Close()
			}
			start := time.Now()
			for len(s.Clients()) > 0 && time.Since(start) < 2*review {
				time.Sleep(10 * time.Millisecond)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("the stream, gone, was let go after %v: its review was not cancelled", d.Round(time.Millisecond))
			}
		})
	}
}

// TestEndedStreamOutputHasSendTimeout: a stream that ends (its token
// revoked) in the push that queued a message for a client that reads
// nothing keeps that message and its stream for good: cleanup stopped
// the send timer.
func TestEndedStreamOutputHasSendTimeout(t *testing.T) {
	old := sendTimeout.Load()
	sendTimeout.Store(int64(time.Second))
	t.Cleanup(func() { sendTimeout.Store(old) })
	a, b := "chains/model-to-endpoints/zA", "chains/model-to-addresses/zB"
	ta, _ := parseTarget(a)
	tb, _ := parseTarget(b)
	var mu sync.Mutex
	codes := map[string]int{ta.access(): 0, tb.access(): http.StatusServiceUnavailable}
	s := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	s.SetAuthorizer(func(r *http.Request, thing string) (string, int, string) {
		mu.Lock()
		defer mu.Unlock()
		if thing == "" {
			return "u", 0, ""
		}
		return "u", codes[thing], "said so"
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.Transport(nil)
	go func() { _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { srv.Close() })
	r := dialRaw(t, ln.Addr().String())
	r.headers(1, adsPath, false)
	_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{a}}))
	var got []byte
	for len(got) < 5 || len(got) < 5+(int(got[3])<<8|int(got[4])) {
		ev := r.next(true)
		if ev.data == nil {
			t.Fatalf("%+v", ev)
		}
		got = append(got, ev.data...)
	}
	// Clusters of B: access not told, held; asked again in a second.
	_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeCluster, ResourceNames: []string{b}}))
	time.Sleep(200 * time.Millisecond)
	// The client reads no more; A is taken away (its Listener goes: a
	// push), and the token is no good for B (the stream ends).
	_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	mu.Lock()
	codes[ta.access()], codes[tb.access()] = http.StatusForbidden, http.StatusUnauthorized
	mu.Unlock()
	eventually(t, "the stream ended", func() string {
		if len(s.Clients()) != 0 {
			return "still a client"
		}
		return ""
	})
	// Its push waits on the window: after sendTimeout the stream is to be
	// reset (its state let go), as any stream whose messages wait.
	_ = r.c.SetReadDeadline(time.Now().Add(4 * time.Duration(sendTimeout.Load())))
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Errorf("no RST_STREAM within %v of a message unread: %v", 4*time.Duration(sendTimeout.Load()), err)
			break
		}
		if f, ok := f.(*http2.RSTStreamFrame); ok {
			t.Logf("reset %v", f.ErrCode)
			return
		}
	}
	// What the stream still holds, once the client reads.
	_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535})
	for {
		ev := r.next(true)
		t.Logf("then: %+v", ev)
		if ev.data == nil {
			return
		}
	}
}

// TestRandomFrames: frames of random types, flags, streams and payloads
// (some well formed) never crash the server, and leave nothing behind.
func TestRandomFrames(t *testing.T) {
	route(t, "rand-app", "rand-model", "10.7.0.12:80")
	s, addr, _ := limitedServer(t, DefaultLimits())
	eds := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{"chains/model-to-endpoints/rand-model"}})
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", adsPath}, {":authority", "x"}, {"content-type", "application/grpc"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := hb.Bytes()
	deadline := time.Now().Add(3 * time.Second)
	for seed := int64(0); time.Now().Before(deadline); seed++ {
		rng := rand.New(rand.NewSource(seed))
		r := dialRaw(t, addr)
		go func() {
			for {
				if _, err := r.fr.ReadFrame(); err != nil {
					return
				}
			}
		}()
		for range 60 {
			id := uint32(rng.Intn(12))
			var p []byte
			switch rng.Intn(4) {
			case 0:
				p = block
			case 1:
				p = eds
			case 2:
				p = make([]byte, rng.Intn(40))
				rng.Read(p)
			case 3:
				p = eds[:rng.Intn(len(eds))]
			}
			typ := http2.FrameType(rng.Intn(11))
			flags := http2.Flags(rng.Intn(256))
			if rng.Intn(3) == 0 && len(p) > 0 { // padded, pad length within
				pad := rng.Intn(len(p) + 1)
				p = append([]byte{byte(pad)}, append(append([]byte(nil), p...), make([]byte, pad)...)...)
				flags |= http2.FlagDataPadded
			}
			if err := r.fr.WriteRawFrame(typ, flags, id, p); err != nil {
				break
			}
		}
		r.c.Close()
	}
	eventually(t, "the server lets go of the clients", func() string { return serverState(s) })
}

// pausableReader reads a raw client's frames in a goroutine, tracking
// the send windows the server gives, and stops reading while paused.
type pausableReader struct {
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	closed bool
	conn   int64
	stream map[uint32]int64
	data   int
	frames []http2.Frame
}

func readPausable(r *rawClient) *pausableReader {
	p := &pausableReader{conn: 65535, stream: map[uint32]int64{}}
	p.cond = sync.NewCond(&p.mu)
	go func() {
		for {
			p.mu.Lock()
			for p.paused && !p.closed {
				p.cond.Wait()
			}
			p.mu.Unlock()
			f, err := r.fr.ReadFrame()
			p.mu.Lock()
			if err != nil {
				p.closed = true
				p.cond.Broadcast()
				p.mu.Unlock()
				return
			}
			switch f := f.(type) {
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					p.conn += int64(f.Increment)
				} else {
					p.stream[f.StreamID] += int64(f.Increment)
				}
			case *http2.DataFrame:
				p.data += len(f.Data())
			case *http2.RSTStreamFrame, *http2.GoAwayFrame, *http2.HeadersFrame:
				p.frames = append(p.frames, f)
			}
			p.cond.Broadcast()
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *pausableReader) pause(b bool) {
	p.mu.Lock()
	p.paused = b
	p.cond.Broadcast()
	p.mu.Unlock()
}

// send sends b on stream id as the windows allow.
func (p *pausableReader) send(t *testing.T, r *rawClient, id uint32, b []byte) {
	t.Helper()
	for len(b) > 0 {
		p.mu.Lock()
		for !p.closed && (p.conn <= 0 || p.stream[id] <= 0) {
			p.cond.Wait()
		}
		if p.closed {
			p.mu.Unlock()
			t.Fatal("closed")
		}
		n := min(int64(len(b)), p.conn, p.stream[id], 16384)
		p.conn -= n
		p.stream[id] -= n
		p.mu.Unlock()
		if err := r.fr.WriteData(id, false, b[:n]); err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
}

// dialSmall is dialRaw over a connection whose receive buffer is small:
// a response the client does not read holds the server's write.
func dialSmall(t *testing.T, addr string, settings ...http2.Setting) *rawClient {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, _ = c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	fr.MaxHeaderListSize = 1 << 20
	_ = fr.WriteSettings(settings...)
	return &rawClient{t: t, c: c, fr: fr, dec: nil}
}

func bigNames(prefix string, n, size int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/%s-%04d-%s", prefix, i, strings.Repeat("x", size))
	}
	return names
}

// TestResetDuringWrite: the client resets its only stream while the
// writer writes a response to it (the client reads slowly): the stream's
// goroutine removes the stream, the writer's done list still names it
// (removeLocked again: harmless, held up).
func TestResetDuringWrite(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	r := dialSmall(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	_ = r.fr.WriteWindowUpdate(0, 1<<30)
	p := readPausable(r)
	p.mu.Lock()
	p.stream[1] = 65535
	p.mu.Unlock()
	r.headers(1, adsPath, false)
	req := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: bigNames("rdw", 1000, 980)})
	p.send(t, r, 1, req[:len(req)-1])
	time.Sleep(200 * time.Millisecond) // the reader has read the window updates
	p.pause(true)
	time.Sleep(100 * time.Millisecond)
	p.send(t, r, 1, req[len(req)-1:])
	// The response (~1 MB+) is written in one write, which waits on the
	// client's reads.
	time.Sleep(500 * time.Millisecond)
	_ = r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	time.Sleep(300 * time.Millisecond) // the stream is let go
	p.pause(false)
	time.Sleep(time.Second)
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Logf("read %d bytes of DATA; frames %v; no crash", p.data, p.frames)
}

// TestResetThenOpenAtLimit: a client at the server's
// SETTINGS_MAX_CONCURRENT_STREAMS (4) resets a stream and opens another
// at once, as RFC 9113 lets it (a reset stream is closed, and counts no
// more): the server, whose stream goroutine has not let the reset one go
// yet, refuses the new one.
func TestResetThenOpenAtLimit(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	r := dialRaw(t, addr)
	var mu sync.Mutex
	refused := 0
	go func() {
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				return
			}
			if f, ok := f.(*http2.RSTStreamFrame); ok && f.ErrCode == http2.ErrCodeRefusedStream {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		}
	}()
	open := []uint32{1, 3, 5, 7}
	for _, id := range open {
		r.headers(id, adsPath, false)
	}
	next := uint32(9)
	for i := 0; i < 200; i++ {
		_ = r.fr.WriteRSTStream(open[0], http2.ErrCodeCancel)
		r.headers(next, adsPath, false)
		open = append(open[1:], next)
		next += 2
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if refused > 0 {
		t.Errorf("%d of 200 streams opened right after a reset, within the limit of 4, refused", refused)
	}
}
