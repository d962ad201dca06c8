package xds

// What a connection keeps at rest, and what ends one that sends too
// slowly: the server's HTTP/2 over time.

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/schema"
	"github.com/prometheus/client_golang/prometheus"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// openBig opens stream 1 on r with a header block of about pad bytes more
// than usual, sent as a HEADERS frame and CONTINUATION frames of 16 KiB.
func openBig(t *testing.T, r *rawClient, pad int) {
	t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fields := []string{":method", "POST", ":scheme", "http", ":path", adsPath, ":authority", "xds",
		"content-type", "application/grpc", "te", "trailers"}
	for i := 0; i < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if pad > 0 {
		_ = enc.WriteField(hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("p", pad), Sensitive: true})
	}
	b := hb.Bytes()
	first := b[:min(len(b), 16384)]
	b = b[len(first):]
	// Written by a framer of its own, let go after: a framer keeps its
	// largest frame's buffer, which the heap measured here would count.
	fr := http2.NewFramer(r.c, nil)
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndHeaders: len(b) == 0}); err != nil {
		t.Fatal(err)
	}
	for len(b) > 0 {
		part := b[:min(len(b), 16384)]
		b = b[len(part):]
		if err := fr.WriteContinuation(1, len(b) == 0, part); err != nil {
			t.Fatal(err)
		}
	}
}

// drain reads and discards what the server writes.
func drain(r *rawClient) { go func() { _, _ = io.Copy(io.Discard, r.c) }() }

// TestHeaderBlockNotKeptAtRest: a client opens its stream with a
// header block of ~60 KiB (HEADERS + CONTINUATION, within the 64 KiB
// bound), sends a request and goes idle. The connection should hold a
// few hundred bytes plus its ADS state at rest; the header block is
// garbage once decoded.
func TestHeaderBlockNotKeptAtRest(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{})
	const n = 40
	measure := func(pad int) int64 {
		before := heapInUse()
		var rs []*rawClient
		for i := 0; i < n; i++ {
			r := dialRaw(t, addr)
			drain(r)
			openBig(t, r, pad)
			_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener}))
			rs = append(rs, r)
		}
		eventually(t, "clients", func() string {
			if len(s.Clients()) != n {
				return "not yet"
			}
			return ""
		})
		time.Sleep(300 * time.Millisecond)
		after := heapInUse()
		for _, r := range rs {
			r.c.Close()
		}
		eventually(t, "clients gone", func() string {
			if len(s.Clients()) != 0 {
				return "not yet"
			}
			return ""
		})
		return (int64(after) - int64(before)) / n
	}
	small := measure(0)
	big := measure(60 << 10)
	t.Logf("heap per idle client: %d bytes with a small header block, %d bytes with a 60 KiB one", small, big)
	if big-small > 16<<10 {
		t.Errorf("a client that opened its stream with a 60 KiB header block holds %d bytes more at rest (the decoded block is kept)", big-small)
	}
}

// TestBigRequestNotKeptAtRest: a client sends a 1 MiB request and goes
// idle; what it holds at rest is no more than a client of a small one.
func TestBigRequestNotKeptAtRest(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{})
	const n = 16
	big := message(&discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/none", VersionInfo: strings.Repeat("v", 1<<20)})
	small := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener})
	measure := func(req []byte) int64 {
		before := heapInUse()
		var rs []*rawClient
		for i := 0; i < n; i++ {
			r := dialRaw(t, addr)
			w := trackWindows(r)
			w.mu.Lock()
			w.stream[1] = 65535
			w.mu.Unlock()
			r.headers(1, adsPath, false)
			w.send(t, r, 1, req, 0)
			w.send(t, r, 1, small, 0)
			rs = append(rs, r)
		}
		eventually(t, "answered", func() string {
			cs := s.Clients()
			if len(cs) != n {
				return "not yet"
			}
			for _, c := range cs {
				if c.Types["listener"].Sent == "" {
					return fmt.Sprintf("not yet: %+v", c)
				}
			}
			return ""
		})
		time.Sleep(300 * time.Millisecond)
		after := heapInUse()
		for _, r := range rs {
			r.c.Close()
		}
		eventually(t, "clients gone", func() string {
			if len(s.Clients()) != 0 {
				return "not yet"
			}
			return ""
		})
		return (int64(after) - int64(before)) / n
	}
	a := measure(small)
	b := measure(big)
	t.Logf("heap per idle client: %d bytes after small requests, %d after a 1 MiB one", a, b)
	if b-a > 32<<10 {
		t.Errorf("a client that sent a 1 MiB request holds %d bytes more at rest", b-a)
	}
}

// TestReaderRespawnKeepsOrder: deep frames (SETTINGS, HEADERS, DATA) and
// shallow ones (PING) interleaved: the server's acknowledgements come in
// the order of the frames (no frame handled twice or out of order across
// the reader's respawns).
func TestReaderRespawnKeepsOrder(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	r := dialRaw(t, addr)
	const rounds = 300
	go func() {
		for i := 0; i < rounds; i++ {
			_ = r.fr.WriteSettings()
			_ = r.fr.WritePing(false, [8]byte{byte(i >> 8), byte(i)})
		}
	}()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	acks, pings := 0, 0
	for pings < rounds {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d pings, %d settings acks: %v", pings, acks, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				acks++
			}
		case *http2.PingFrame:
			if got := int(f.Data[0])<<8 | int(f.Data[1]); got != pings {
				t.Fatalf("ping %d acknowledged as %d-th", got, pings)
			}
			pings++
			if acks != pings+1 { // dialRaw's own settings first
				t.Fatalf("ping %d acknowledged after %d settings acks", pings-1, acks)
			}
		case *http2.GoAwayFrame:
			t.Logf("goaway %v", f.ErrCode)
			return
		}
	}
}

// slowConn opens a TCP connection to addr.
func slowConn(t *testing.T, addr string) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reports how long until the server closed c (reading and
// discarding), or -1 after max.
func closedWithin(c net.Conn, max time.Duration, trickle func(i int) bool) time.Duration {
	start := time.Now()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, c)
		close(done)
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			return time.Since(start)
		case <-time.After(time.Second):
		}
		if time.Since(start) > max {
			return -1
		}
		if trickle != nil && !trickle(i) {
			trickle = nil
		}
	}
}

// TestSlowloris: a preface a byte a second, a frame header a byte
// a second (no stream), a payload a byte a second: each connection is
// closed within its bound.
func TestSlowloris(t *testing.T) {
	preface, idle, frame := h2PrefaceTimeout, h2IdleTimeout, h2FrameTimeout
	h2PrefaceTimeout, h2IdleTimeout, h2FrameTimeout = time.Second, 3*time.Second, time.Second
	t.Cleanup(func() { h2PrefaceTimeout, h2IdleTimeout, h2FrameTimeout = preface, idle, frame })
	_, addr, _ := limitedServer(t, Limits{})
	type tc struct {
		name  string
		setup func(c net.Conn) func(i int) bool
		max   time.Duration
	}
	pre := []byte(http2.ClientPreface)
	cases := []tc{
		{"preface", func(c net.Conn) func(int) bool {
			return func(i int) bool { _, err := c.Write(pre[i%len(pre) : i%len(pre)+1]); return err == nil }
		}, 3 * time.Second},
		{"frame header", func(c net.Conn) func(int) bool {
			_, _ = c.Write(pre)
			hdr := []byte{0, 0, 8, framePing, 0, 0, 0, 0, 0}
			return func(i int) bool {
				if i >= len(hdr)-1 {
					return false
				}
				_, err := c.Write(hdr[i : i+1])
				return err == nil
			}
		}, 5 * time.Second},
		{"payload", func(c net.Conn) func(int) bool {
			_, _ = c.Write(pre)
			_, _ = c.Write([]byte{0, 0x40, 0, 0xf0, 0, 0, 0, 0, 0}) // unknown type, 16 KiB
			return func(i int) bool { _, err := c.Write([]byte{0}); return err == nil }
		}, 3 * time.Second},
	}
	results := make(chan string, len(cases))
	for _, k := range cases {
		go func() {
			c := slowConn(t, addr)
			d := closedWithin(c, k.max, k.setup(c))
			if d < 0 {
				results <- k.name + ": not closed within " + k.max.String()
				return
			}
			results <- k.name + ": closed after " + d.Round(time.Second).String()
		}()
	}
	for range cases {
		msg := <-results
		t.Log(msg)
		if strings.Contains(msg, "not closed") {
			t.Error(msg)
		}
	}
}

// TestFrameBufferNotKeptAtRest: clients that connect over time
// (a GC between them, as in a fleet that connects over hours), open
// their stream with an ordinary HEADERS frame, and go idle. Each should
// hold what a client holds at rest; the frame buffer its HEADERS was read
// into goes back to framePool and is not the connection's.
func TestFrameBufferNotKeptAtRest(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{})
	const n = 40
	live16k := func() int64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		for _, c := range m.BySize {
			if c.Size == 16384 {
				return int64(c.Mallocs - c.Frees)
			}
		}
		return -1
	}
	measure := func(gcBetween bool) int64 {
		before := heapInUse()
		before16 := live16k()
		var rs []*rawClient
		for i := 0; i < n; i++ {
			if gcBetween {
				runtime.GC()
				runtime.GC()
			}
			r := dialRaw(t, addr)
			drain(r)
			r.headers(1, adsPath, false)
			_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener}))
			rs = append(rs, r)
			eventually(t, "client", func() string {
				if len(s.Clients()) != i+1 {
					return "not yet"
				}
				return ""
			})
		}
		time.Sleep(300 * time.Millisecond)
		after := heapInUse()
		pinned := live16k() - before16
		t.Logf("gcBetween %v: 16 KiB objects live: %d more with %d idle clients", gcBetween, pinned, n)
		if pinned > n/4 {
			t.Errorf("%d idle clients hold %d buffers of 16 KiB (framePool's, pinned by each connection's hpack decoder)", n, pinned)
		}
		for _, r := range rs {
			r.c.Close()
		}
		eventually(t, "clients gone", func() string {
			if len(s.Clients()) != 0 {
				return "not yet"
			}
			return ""
		})
		return (int64(after) - int64(before)) / n
	}
	burst := measure(false)
	spread := measure(true)
	t.Logf("heap per idle client: %d bytes connected in a burst, %d connected with GCs between", burst, spread)
}

// TestUnfinishedHeaderBlockEnds: a client with an idle stream starts a
// second stream's header block (HEADERS without END_HEADERS) and sends
// CONTINUATIONs up to ~60 KiB, then nothing more: the block is held as
// long as the connection, no timeout applies between frames of a block.
func TestUnfinishedHeaderBlockEnds(t *testing.T) {
	was := h2FrameTimeout
	h2FrameTimeout = time.Second
	t.Cleanup(func() { h2FrameTimeout = was })
	s, addr, _ := limitedServer(t, DefaultLimits())
	const n = 40
	before := heapInUse()
	for i := 0; i < n; i++ {
		r := dialRaw(t, addr)
		drain(r)
		r.headers(1, adsPath, false)
		_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener}))
		chunk := bytes.Repeat([]byte{0x40}, 16000) // never decoded: the block does not end
		_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: chunk})
		for j := 0; j < 3; j++ {
			_ = r.fr.WriteContinuation(3, false, chunk)
		}
	}
	eventually(t, "clients", func() string {
		if len(s.Clients()) != n {
			return "not yet"
		}
		return ""
	})
	time.Sleep(3 * time.Second) // past h2FrameTimeout
	after := heapInUse()
	alive := len(s.Clients())
	per := (int64(after) - int64(before)) / n
	t.Logf("%d of %d connections alive 3 s after a header block begun (h2FrameTimeout 1 s); heap per connection %d bytes", alive, n, per)
	if alive != 0 {
		t.Errorf("%d of %d connections with a header block begun and never ended still open after 3 s", alive, n)
	}
}

// TestTLSHandshakeStallEvicted: at the connection limit, connections that
// never finish their TLS handshake do not lock a real client out.
func TestTLSHandshakeStallEvicted(t *testing.T) {
	cfg, pool := selfSigned(t)
	s := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	s.SetLimits(Limits{Connections: 8, ConnectionsPerCaller: 64})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.Transport(cfg)
	go func() { _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()
	for i := 0; i < 16; i++ {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.0.%d", 2+i%4))}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_, _ = c.Write([]byte{0x16, 0x03, 0x01}) // a ClientHello begun
	}
	time.Sleep(evictAfter + 200*time.Millisecond) // newcomers are safe from eviction for evictAfter
	start := time.Now()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}, Timeout: 3 * time.Second}
	tc, err := tls.DialWithDialer(&d, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("a real client at the limit: %v", err)
	}
	defer tc.Close()
	_, _ = tc.Write([]byte(http2.ClientPreface))
	r := &rawClient{t: t, c: tc, fr: http2.NewFramer(tc, tc), dec: hpack.NewDecoder(4096, nil)}
	_ = r.fr.WriteSettings()
	r.headers(1, adsPath, false)
	_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener}))
	if e := r.next(true); e.data == nil {
		t.Fatalf("a real client at the limit: %+v, want a response", e)
	}
	t.Logf("answered after %v", time.Since(start))
}

// TestReloadReachesManyClients: a reload with many clients connected
// (XDS_RELOAD_CLIENTS, 1000 by default): each gets its push.
func TestReloadReachesManyClients(t *testing.T) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("XDS_RELOAD_CLIENTS")); err == nil {
		n = v
	}
	a, _ := backend(t)
	route(t, "mc-app", "mc-model", a)
	s, addr, _ := limitedServer(t, Limits{})
	known := "chains/model-to-endpoints/mc-model"
	for i := 0; i < n; i++ {
		r := dialRaw(t, addr)
		drain(r)
		r.headers(1, adsPath, false)
		_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{known}}))
	}
	sent := func(want string) func() string {
		return func() string {
			cs := s.Clients()
			if len(cs) != n {
				return fmt.Sprintf("%d clients", len(cs))
			}
			bad := 0
			for _, c := range cs {
				if c.Types["listener"].Sent != want {
					bad++
				}
			}
			if bad > 0 {
				return fmt.Sprintf("%d of %d clients not sent %s", bad, n, want)
			}
			return ""
		}
	}
	eventually(t, "first responses", sent("1"))
	example, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "examples", "appmodel", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
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
	t.Cleanup(func() {
		if _, err := engine.Reload(plan); err != nil {
			t.Error(err)
		}
	})
	body, _, _ := strings.Cut(string(example), "chains:")
	start := time.Now()
	reload(body)
	eventually(t, "pushes after a reload", sent("2"))
	t.Logf("%d clients pushed after a reload in %v", n, time.Since(start))
	reload(string(example))
	eventually(t, "pushes after a second reload", sent("3"))
}
