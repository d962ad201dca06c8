package xds

// Flow control of the server's HTTP/2, both ways: what a client may make
// a stream hold, and that a client that honours the windows is never left
// waiting.

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
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

// TestMessageTimeoutWhileWindowHeld: a client that honours the windows
// and reads its responses as fast as its link allows (here ~500 KB/s)
// gets a response of ~2.3 MB. Meanwhile it sends a small request (whole,
// it waits behind the response) and then one of 200 KB: the server
// holds back that one's credit until the small one is handled, i.e.
// until the response is written; the message timeout, started at its
// first byte, ends the stream meanwhile (INVALID_ARGUMENT "not received
// within"), though the client sent all the server let it.
func TestMessageTimeoutWhileWindowHeld(t *testing.T) {
	old := messageTimeout.Load()
	messageTimeout.Store(int64(time.Second)) // 10 s in production; the response takes ~4 s here
	t.Cleanup(func() { messageTimeout.Store(old) })
	_, addr, _ := limitedServer(t, Limits{})
	r := dialRaw(t, addr)
	c := &creditChecker{t: t, r: r, conn: 65535, win: map[uint32]int64{1: 65535}, resp: map[uint32]int{}, buf: map[uint32][]byte{}, status: map[uint32]string{}}
	c.cond = sync.NewCond(&c.mu)
	c.delay = -1                              // throttled: see below
	go c.readThrottled(30 * time.Millisecond) // per 16 KiB frame: ~530 KB/s
	r.headers(1, adsPath, false)
	rng := rand.New(rand.NewSource(1))
	m0 := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: bigNames("mt", 1000, 980)})
	if ok, why := c.sendMsg(rng, 1, m0, false); !ok {
		t.Fatal(why)
	}
	c.mu.Lock()
	c.waitFor(10*time.Second, func() bool { return len(c.buf[1]) > 0 })
	c.mu.Unlock()
	start := time.Now()
	m1 := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeCluster, ResourceNames: []string{"chains/model-to-endpoints/mt1"}})
	m2 := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeRoute, ResourceNames: bigNames("mt2", 200, 980)})
	for _, m := range [][]byte{m1, m2} {
		if ok, why := c.sendMsg(rand.New(rand.NewSource(2)), 1, m, false); !ok {
			t.Logf("send: %s", why)
			break
		}
	}
	c.mu.Lock()
	c.waitFor(15*time.Second, func() bool { return c.resp[1] >= 3 || len(c.bad) > 0 || c.status[1] != "" })
	defer c.mu.Unlock()
	t.Logf("after %v: %d responses, status %q, bad %v", time.Since(start).Round(time.Millisecond), c.resp[1], c.status[1], c.bad)
	if c.status[1] != "" || c.resp[1] < 3 {
		t.Errorf("a client that sent every byte the server's window allowed lost its stream: status %q (%d responses of 3)", c.status[1], c.resp[1])
	}
}

// TestHeldDuringReview: while a request is handled (an access review
// that takes its time, as a TokenAuth review over the network does),
// no whole message waits in inbox: the next request of 1.5 MiB gets its
// credit early, whole, and then a window more. The stream holds two
// whole requests and a window.
func TestHeldDuringReview(t *testing.T) {
	s := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	inReview := make(chan struct{}, 4)
	s.SetAuthorizer(func(r *http.Request, thing string) (string, int, string) {
		if thing == "" {
			return "u", 0, ""
		}
		inReview <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-time.After(3 * time.Second):
		}
		return "u", 0, ""
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.Transport(nil)
	go func() { _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { srv.Close() })
	r := dialRaw(t, ln.Addr().String())
	w := trackWindows(r)
	w.mu.Lock()
	w.stream[1] = 65535
	w.mu.Unlock()
	r.headers(1, adsPath, false)
	big := func(tag string) []byte {
		return message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/" + tag}, VersionInfo: strings.Repeat("v", maxMessage-200)})
	}
	before := heapInUse()
	w.send(t, r, 1, big("rv1"), 0)
	<-inReview
	sent := 0
	for i := 2; i < 6; i++ {
		m := big(fmt.Sprint("rv", i))
		if !w.trySend(t, r, 1, m, 0, 500*time.Millisecond) {
			break
		}
		sent += len(m)
	}
	time.Sleep(200 * time.Millisecond)
	grown := int64(heapInUse()) - int64(before)
	w.mu.Lock()
	held := 65535 - w.stream[1]
	w.mu.Unlock()
	t.Logf("during the review of a request of %d bytes the client sent %d bytes more whole; the window holds back %d; heap grew %d KiB", len(big("x")), sent, held, grown>>10)
	if grown > 2*maxMessage+(1<<20) {
		t.Errorf("while one request of 1.5 MiB is under review, the heap grew %d KiB", grown>>10)
	}
}
