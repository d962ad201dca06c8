package xds

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// windowTracker reads a raw client's frames in a goroutine and keeps the
// send windows (connection and stream 1) the server gives it. It does
// not acknowledge the server's settings (the server needs no
// acknowledgement), so that it writes nothing beside the test.
type windowTracker struct {
	wmu      sync.Mutex // held while writing to the framer
	mu       sync.Mutex
	cond     *sync.Cond
	conn     int64
	stream   map[uint32]int64
	closed   bool
	frames   []http2.Frame
	dataRecv int
}

func trackWindows(r *rawClient) *windowTracker {
	w := &windowTracker{conn: 65535, stream: map[uint32]int64{}}
	w.cond = sync.NewCond(&w.mu)
	go func() {
		for {
			f, err := r.fr.ReadFrame()
			w.mu.Lock()
			if err != nil {
				w.closed = true
				w.cond.Broadcast()
				w.mu.Unlock()
				return
			}
			switch f := f.(type) {
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					w.conn += int64(f.Increment)
				} else {
					w.stream[f.StreamID] += int64(f.Increment)
				}
			case *http2.DataFrame:
				w.dataRecv += len(f.Data())
			case *http2.RSTStreamFrame, *http2.GoAwayFrame, *http2.HeadersFrame:
				w.frames = append(w.frames, f)
			}
			w.cond.Broadcast()
			w.mu.Unlock()
		}
	}()
	return w
}

// send sends b on stream id as the windows allow, in frames of at most
// 16 KiB; the last frame carries last bytes alone.
func (w *windowTracker) send(t *testing.T, r *rawClient, id uint32, b []byte, last int) {
	t.Helper()
	if !w.trySend(t, r, id, b, last, time.Hour) {
		t.Fatal("the windows stayed closed")
	}
}

// trySend is send, that gives up (false) when the windows stay closed
// for wait.
func (w *windowTracker) trySend(t *testing.T, r *rawClient, id uint32, b []byte, last int, wait time.Duration) bool {
	t.Helper()
	body, tail := b[:len(b)-last], b[len(b)-last:]
	for _, part := range [][]byte{body, tail} {
		for len(part) > 0 {
			w.mu.Lock()
			timer := time.AfterFunc(wait, func() {
				w.mu.Lock()
				w.cond.Broadcast()
				w.mu.Unlock()
			})
			deadline := time.Now().Add(wait)
			for !w.closed && (w.conn <= 0 || w.stream[id] <= 0) && time.Now().Before(deadline) {
				w.cond.Wait()
			}
			timer.Stop()
			if w.closed {
				w.mu.Unlock()
				t.Fatalf("the connection closed: %v", w.frames)
			}
			if w.conn <= 0 || w.stream[id] <= 0 {
				w.mu.Unlock()
				return false
			}
			n := min(int64(len(part)), w.conn, w.stream[id], 16384)
			w.conn -= n
			w.stream[id] -= n
			w.mu.Unlock()
			w.wmu.Lock()
			err := r.fr.WriteData(id, false, part[:n])
			w.wmu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			part = part[n:]
		}
	}
	return true
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestQueuedRequestsBoundedByWindow: while a stream's response waits
// (the client's window is 0), its requests wait, and every byte of them
// holds its flow-control credit, the parts of a message not yet whole
// too: a client that sends requests of 1 MiB, each ending in a frame of
// one byte, is held at its window.
func TestQueuedRequestsBoundedByWindow(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{})
	r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	w := trackWindows(r)
	w.mu.Lock()
	w.stream[1] = 65535
	w.mu.Unlock()
	r.headers(1, adsPath, false)
	// The first request is answered; the answer waits on a window of 0.
	w.send(t, r, 1, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener}), 0)
	eventually(t, "the stalled response", func() string {
		if cs := s.Clients(); len(cs) != 1 || cs[0].Types["listener"].Sent != "1" {
			return "not yet"
		}
		return ""
	})
	before := heapInUse()
	big := message(&discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/none", VersionInfo: strings.Repeat("v", 1<<20)})
	n := 0
	for ; n < 128 && w.trySend(t, r, 1, big, 1, time.Second); n++ {
	}
	if n > 1 {
		t.Errorf("%d requests of 1 MiB sent whole while the stream's response waits: the window holds all but one back", n)
	}
	// Let the reader finish what was sent.
	time.Sleep(500 * time.Millisecond)
	after := heapInUse()
	grown := int64(after) - int64(before)
	w.mu.Lock()
	held := 65535 - w.stream[1]
	w.mu.Unlock()
	t.Logf("queued %d requests of %d bytes; the stream's window holds back %d bytes; heap grew %d MiB", n, len(big), held, grown>>20)
	if grown > 16<<20 {
		t.Errorf("a client whose window holds back %d bytes made the server hold %d MiB of queued requests", held, grown>>20)
	}
}

// TestServerRespectsClientWindows: the client changes its initial window
// mid-stream (to 0, making windows negative, and up again) and hands out
// credit in odd sizes; the server never sends more than the windows.
func TestServerRespectsClientWindows(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	for seed := int64(1); seed <= 200; seed++ {
		t.Run("", func(t *testing.T) { windowsRun(t, addr, seed) })
	}
}

func windowsRun(t *testing.T, addr string, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	initial := int64(1000)
	r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(initial)})
	r.headers(1, adsPath, false)
	names := make([]string, 400)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/win-%d-%04d", seed, i)
	}
	_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names}))
	conn, stream := int64(65535), initial
	settingsOut := false // a SETTINGS of ours not acknowledged
	firstAcked := false
	var pendingLower int64
	got, want := 0, -1
	var msg []byte
	_ = r.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for want < 0 || got < want {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading after %d of %d bytes (stream window %d, connection %d): %v", got, want, stream, conn, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = r.fr.WriteSettingsAck()
			} else if !firstAcked {
				firstAcked = true // of dialRaw's SETTINGS
			} else if settingsOut {
				settingsOut = false
				stream -= pendingLower // a lowering binds once acknowledged
				pendingLower = 0
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			t.Fatalf("%v", f)
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				t.Fatalf("trailers after %d of %d bytes", got, want)
			}
		case *http2.DataFrame:
			n := int64(len(f.Data()))
			if n > stream || n > conn {
				t.Fatalf("seed %d: DATA of %d bytes, the stream's window %d, the connection's %d", seed, n, stream, conn)
			}
			stream -= n
			conn -= n
			got += int(n)
			msg = append(msg, f.Data()...)
			if want < 0 && len(msg) >= 5 {
				want = 5 + int(uint32(msg[1])<<24|uint32(msg[2])<<16|uint32(msg[3])<<8|uint32(msg[4]))
			}
		}
		// The client's moves.
		switch rng.Intn(6) {
		case 0:
			if !settingsOut {
				v := []int64{0, 0, 1, 300, 5000, 70000}[rng.Intn(6)]
				delta := v - initial
				initial = v
				if delta > 0 {
					stream += delta // usable at once
				} else {
					pendingLower = -delta
				}
				settingsOut = true
				_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(v)})
			}
		case 1, 2:
			inc := int64(1 + rng.Intn(3000))
			stream += inc
			_ = r.fr.WriteWindowUpdate(1, uint32(inc))
		case 3:
			if conn < 20000 {
				inc := int64(1 + rng.Intn(40000))
				conn += inc
				_ = r.fr.WriteWindowUpdate(0, uint32(inc))
			}
		}
		// Never stuck: a window of nothing is opened.
		if stream-pendingLower <= 0 && !settingsOut {
			inc := 1 - (stream - pendingLower) + int64(rng.Intn(2000))
			stream += inc
			_ = r.fr.WriteWindowUpdate(1, uint32(inc))
		}
		if conn <= 0 {
			conn += 30000
			_ = r.fr.WriteWindowUpdate(0, 30000)
		}
	}
}

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
	if len(g.streams) > 0 || len(g.names) > 0 || len(g.conns) > 0 || len(g.unowned) > 0 || g.open != 0 || g.idle.Len() != 0 {
		out = append(out, fmt.Sprintf("gate streams %v names %v conns %v unowned %v open %d idle %d", g.streams, g.names, g.conns, g.unowned, g.open, g.idle.Len()))
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

// countingListener counts the writes to its connections.
type countingListener struct {
	net.Listener
	writes, bytes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{c, l}, nil
}

type countingConn struct {
	net.Conn
	l *countingListener
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.l.writes.Add(1)
	c.l.bytes.Add(int64(len(b)))
	return c.Conn.Write(b)
}

// TestTLSWrites: over TLS, grpc-go's client gets its answers; the writes
// each response costs are counted.
func TestTLSWrites(t *testing.T) {
	names := make([]string, 400)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/tls-%04d-%s", i, strings.Repeat("x", 60))
	}
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprint("tls=", useTLS), func(t *testing.T) {
			s := New(engine, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cl := &countingListener{Listener: ln}
			creds := insecure.NewCredentials()
			var cfg *tls.Config
			if useTLS {
				var pool *x509.CertPool
				cfg, pool = selfSigned(t)
				creds = credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"})
			}
			srv := s.Transport(cfg)
			go func() { _ = srv.Serve(s.Listener(cl)) }()
			t.Cleanup(func() { srv.Close() })
			conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names[:1]}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				t.Fatal(err)
			}
			w0, b0 := cl.writes.Load(), cl.bytes.Load()
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names, ResponseNonce: "1", VersionInfo: "1"}); err != nil {
				t.Fatal(err)
			}
			resp, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("a response of %d Listeners (%d bytes on the wire): %d writes to the socket", len(resp.Resources), cl.bytes.Load()-b0, cl.writes.Load()-w0)
		})
	}
}

// TestWritesPerFrame: a response through s.Listener, read by a raw
// client (run under strace to count the server's write(2)s).
func TestWritesPerFrame(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	names := make([]string, 400)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/wpf-%04d-%s", i, strings.Repeat("x", 60))
	}
	r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	_ = r.fr.WriteWindowUpdate(0, 1<<30)
	r.headers(1, adsPath, false)
	m := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names})
	for ; len(m) > 0; m = m[min(len(m), 16384):] {
		_ = r.fr.WriteData(1, false, m[:min(len(m), 16384)])
	}
	got := 0
	for got < 190000 {
		ev := r.next(false)
		if ev.data == nil {
			t.Fatalf("%+v", ev)
		}
		got += len(ev.data)
	}
	t.Logf("%d bytes", got)
}

// TestCloseDuringActivity: Transport.Close while clients stream, stall,
// reset and connect; nothing is left after.
func TestCloseDuringActivity(t *testing.T) {
	route(t, "close-app", "close-model", "10.7.0.10:80")
	eds := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{"chains/model-to-endpoints/close-model"}})
	baseline := runtime.NumGoroutine()
	for round := range 5 {
		s := New(engine, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
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

// TestBigResponsesToGRPCGo: grpc-go (its BDP window growth, and a fixed
// small window) gets responses of megabytes, pushed back to back.
func TestBigResponsesToGRPCGo(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/big-%04d-%s", i, strings.Repeat("y", 980))
	}
	for _, opts := range [][]grpc.DialOption{nil, {grpc.WithInitialWindowSize(1 << 16), grpc.WithInitialConnWindowSize(1 << 16)}} {
		conn, err := grpc.NewClient("passthrough:///"+addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// Two requests before any read: the second comes whole while the
		// first's response waits (a third would wait on the client's
		// read of that response, which this client makes after its
		// sends: a client that sends and reads in turn, as a bidi
		// stream's client does, reads first).
		for _, typ := range []string{TypeListener, TypeCluster} {
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: typ, ResourceNames: names}); err != nil {
				t.Fatal(err)
			}
		}
		size := 0
		for i := range 2 + 1 { // LDS, CDS: one response each; RDS: one per name
			if i == 1 {
				if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeRoute, ResourceNames: names}); err != nil {
					t.Fatal(err)
				}
			}
			r, err := st.Recv()
			if err != nil {
				t.Fatalf("after %v: %v", time.Since(start), err)
			}
			size += proto.Size(r)
			time.Sleep(200 * time.Millisecond) // reads slowly
			_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: r.TypeUrl, ResourceNames: names, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce})
		}
		t.Logf("%d bytes in %v", size, time.Since(start))
		cancel()
		conn.Close()
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
			s := New(engine, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
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
	old := sendTimeout
	sendTimeout = time.Second
	t.Cleanup(func() { sendTimeout = old })
	a, b := "chains/model-to-endpoints/zA", "chains/model-to-addresses/zB"
	ta, _ := parseTarget(a)
	tb, _ := parseTarget(b)
	var mu sync.Mutex
	codes := map[string]int{ta.access(): 0, tb.access(): http.StatusServiceUnavailable}
	s := New(engine, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
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
	_ = r.c.SetReadDeadline(time.Now().Add(4 * sendTimeout))
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Errorf("no RST_STREAM within %v of a message unread: %v", 4*sendTimeout, err)
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

// TestQueuedEmptyRequests: 64 KiB of window in empty requests (5 bytes
// each) queued behind a stalled response: what does the server hold?
func TestQueuedEmptyRequests(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{})
	r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	w := trackWindows(r)
	w.mu.Lock()
	w.stream[1] = 65535
	w.mu.Unlock()
	r.headers(1, adsPath, false)
	w.send(t, r, 1, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener}), 0)
	eventually(t, "the stalled response", func() string {
		if cs := s.Clients(); len(cs) != 1 || cs[0].Types["listener"].Sent != "1" {
			return "not yet"
		}
		return ""
	})
	before := heapInUse()
	empty := make([]byte, 5*3276) // 3276 empty messages a frame
	for range 4 {
		w.send(t, r, 1, empty, 0)
	}
	time.Sleep(300 * time.Millisecond)
	grown := int64(heapInUse()) - int64(before)
	t.Logf("%d bytes of empty requests held: heap grew %d KiB", 4*len(empty), grown>>10)
	if grown > 1<<20 {
		t.Errorf("%d bytes of empty requests made the heap grow %d KiB", 4*len(empty), grown>>10)
	}
}

// TestSplitMessages: a request byte by byte (its prefix split), one
// exactly the stream's window, padded frames of every pad length, are
// answered.
func TestSplitMessages(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	want := func(r *rawClient, what string) {
		t.Helper()
		for {
			ev := r.next(true)
			if ev.data != nil {
				return
			}
			if ev.closed || ev.rst != 0 || ev.goAway != 0 || ev.status != "" {
				t.Fatalf("%s: %+v", what, ev)
			}
		}
	}
	m := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/split"}})
	r := dialRaw(t, addr)
	r.headers(1, adsPath, false)
	for i := range m {
		_ = r.fr.WriteData(1, false, m[i:i+1])
	}
	want(r, "byte by byte")
	// Exactly 65535 bytes: one request of 65535-5 bytes, in full frames.
	name := "chains/model-to-endpoints/" + strings.Repeat("w", 900)
	var names []string
	for i := 0; ; i++ {
		n := fmt.Sprintf("%s-%d", name, i)
		if len(message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeCluster, ResourceNames: append(names, n)})) > 65535 {
			break
		}
		names = append(names, n)
	}
	m = message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeCluster, ResourceNames: names, VersionInfo: strings.Repeat("v", 65535-len(message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeCluster, ResourceNames: names}))-3)})
	t.Logf("a request of %d bytes", len(m))
	r = dialRaw(t, addr)
	r.headers(1, adsPath, false)
	for b := m; len(b) > 0; b = b[min(len(b), 16384):] {
		_ = r.fr.WriteData(1, false, b[:min(len(b), 16384)])
	}
	want(r, "a window's worth")
	// Then at once another: the window was given back.
	m = message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/after"}})
	_ = r.fr.WriteData(1, false, m)
	want(r, "after a window's worth")
	// Padded frames.
	r = dialRaw(t, addr)
	r.headers(1, adsPath, false)
	for pad := 0; pad < 256; pad += 17 {
		m := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{fmt.Sprintf("chains/model-to-endpoints/pad-%d", pad)}})
		_ = r.fr.WriteDataPadded(1, false, m[:3], make([]byte, pad))
		_ = r.fr.WriteDataPadded(1, false, nil, make([]byte, pad)) // nothing but padding
		_ = r.fr.WriteDataPadded(1, false, m[3:], make([]byte, pad))
		want(r, fmt.Sprintf("pad %d", pad))
	}
}
