package xds

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

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

var (
	_ = context.Background
	_ = io.Discard
	_ = slog.New
	_ = rand.New
	_ = net.Dial
	_ = http.StatusOK
	_ atomic.Int64
	_ = grpc.NewClient
	_ = insecure.NewCredentials
)

// creditChecker is a raw client that honours the server's windows and
// reads its responses concurrently (granting window for them at once),
// as grpc-go does; it tracks what the server grants.
type creditChecker struct {
	t    *testing.T
	r    *rawClient
	wmu  sync.Mutex // framer writes
	mu   sync.Mutex
	cond *sync.Cond
	conn int64
	win  map[uint32]int64 // the client's send window per stream
	// responses per stream (whole gRPC messages), the trailers' status.
	resp   map[uint32]int
	buf    map[uint32][]byte
	status map[uint32]string
	bad    []string
	closed bool
	delay  time.Duration // before a grant for DATA read
}

func newCreditChecker(t *testing.T, addr string, window uint32, delay time.Duration) *creditChecker {
	r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	c := &creditChecker{t: t, r: r, conn: 65535, win: map[uint32]int64{}, resp: map[uint32]int{}, buf: map[uint32][]byte{}, status: map[uint32]string{}}
	c.delay = delay
	c.cond = sync.NewCond(&c.mu)
	go c.read()
	return c
}

func (c *creditChecker) write(f func(fr *http2.Framer) error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := f(c.r.fr); err != nil {
		c.mu.Lock()
		c.bad = append(c.bad, "write: "+err.Error())
		c.mu.Unlock()
	}
}

func (c *creditChecker) read() {
	for {
		f, err := c.r.fr.ReadFrame()
		c.mu.Lock()
		if err != nil {
			c.closed = true
			c.cond.Broadcast()
			c.mu.Unlock()
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				go c.write(func(fr *http2.Framer) error { return fr.WriteSettingsAck() })
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.conn += int64(f.Increment)
			} else {
				c.win[f.StreamID] += int64(f.Increment)
			}
		case *http2.DataFrame:
			id, n := f.StreamID, len(f.Data())
			if n > 0 {
				d := time.Duration(0)
				if c.delay > 0 {
					d = time.Duration(rand.Int63n(int64(c.delay)))
				}
				go c.write(func(fr *http2.Framer) error {
					time.Sleep(d)
					_ = fr.WriteWindowUpdate(0, uint32(n))
					return fr.WriteWindowUpdate(id, uint32(n))
				})
			}
			b := append(c.buf[id], f.Data()...)
			for len(b) >= 5 {
				m := 5 + int(uint32(b[1])<<24|uint32(b[2])<<16|uint32(b[3])<<8|uint32(b[4]))
				if len(b) < m {
					break
				}
				b = b[m:]
				c.resp[id]++
			}
			c.buf[id] = append([]byte(nil), b...)
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				fields, _ := c.r.dec.DecodeFull(f.HeaderBlockFragment())
				st := "?"
				for _, hf := range fields {
					if hf.Name == "grpc-status" {
						st = hf.Value
					}
				}
				c.status[f.StreamID] = st
			} else {
				_, _ = c.r.dec.DecodeFull(f.HeaderBlockFragment())
			}
		case *http2.RSTStreamFrame:
			c.bad = append(c.bad, fmt.Sprint(f))
		case *http2.GoAwayFrame:
			c.bad = append(c.bad, fmt.Sprintf("%v %q", f, f.DebugData()))
		}
		c.cond.Broadcast()
		c.mu.Unlock()
	}
}

// waitFor waits up to d for cond (under c.mu); false when it timed out.
func (c *creditChecker) waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	timer := time.AfterFunc(d, func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer timer.Stop()
	for !cond() && !c.closed && len(c.bad) == 0 && time.Now().Before(deadline) {
		c.cond.Wait()
	}
	return cond()
}

// sendMsg sends m on stream id in frames of random sizes, some padded,
// some of padding alone, honouring the windows; end sets END_STREAM on
// the frame that carries m's last byte. It reports false when the
// windows stayed closed for 5 s.
func (c *creditChecker) sendMsg(rng *rand.Rand, id uint32, m []byte, end bool) (bool, string) {
	for len(m) > 0 {
		var size int
		switch rng.Intn(4) {
		case 0:
			size = 1 + rng.Intn(16)
		case 1:
			size = 16384
		default:
			size = 1 + rng.Intn(16384)
		}
		padded := rng.Intn(5) == 0
		pad := 0
		if padded {
			pad = rng.Intn(256)
			size = min(size, 16384-1-pad)
		}
		onlyPad := padded && rng.Intn(4) == 0
		c.mu.Lock()
		var cost int64
		ok := c.waitFor(5*time.Second, func() bool {
			avail := min(c.conn, c.win[id])
			if onlyPad {
				return avail >= int64(1+pad)
			}
			over := int64(0)
			if padded {
				over = int64(1 + pad)
			}
			return avail > over
		})
		if !ok {
			state := fmt.Sprintf("windows stayed closed: conn %d stream %d, %d bytes of the message left; bad %v closed %v", c.conn, c.win[id], len(m), c.bad, c.closed)
			c.mu.Unlock()
			return false, state
		}
		avail := min(c.conn, c.win[id])
		var data []byte
		if onlyPad {
			cost = int64(1 + pad)
		} else {
			over := 0
			if padded {
				over = 1 + pad
			}
			n := min(size, len(m), int(avail)-over)
			data = m[:n]
			cost = int64(n + over)
		}
		c.conn -= cost
		c.win[id] -= cost
		c.mu.Unlock()
		m = m[len(data):]
		last := end && len(m) == 0
		c.write(func(fr *http2.Framer) error {
			if padded {
				return fr.WriteDataPadded(id, last, data, make([]byte, pad))
			}
			return fr.WriteData(id, last, data)
		})
	}
	return true, ""
}

// requestOf is an LDS request of about size bytes (gRPC prefix included)
// that the server answers (a new subscription each time).
func requestOf(tag string, size int) []byte {
	base := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/" + tag}})
	if size <= len(base) {
		return base
	}
	// VersionInfo of v bytes costs v + 1 + len(varint(v)).
	for v := size - len(base) - 4; v < size; v++ {
		m := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/" + tag}, VersionInfo: strings.Repeat("v", max(v, 0))})
		if len(m) >= size {
			return m
		}
	}
	return base
}

// TestCreditRandomized: streams send requests of random sizes (a few
// bytes to 1.4 MiB, some exactly the window, or its multiples) in
// random frames (padded, padding alone, END_STREAM on the last), a few
// at a time; each is answered; once answered, the stream's window is
// whole again.
func TestCreditRandomized(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	deadline := time.Now().Add(durationEnv("XDS_CREDIT_FOR", 4*time.Second))
	seed := int64(1)
	for ; time.Now().Before(deadline); seed++ {
		if !creditRun(t, addr, seed) {
			return
		}
	}
	t.Logf("%d seeds", seed-1)
}

// durationEnv is the duration in the environment's name
// (XDS_CREDIT_FOR, XDS_STRESS_FOR: to run the randomized tests longer),
// else def.
func durationEnv(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(strings.TrimSpace(os.Getenv(name))); err == nil {
		return d
	}
	return def
}

func creditRun(t *testing.T, addr string, seed int64) bool {
	rng := rand.New(rand.NewSource(seed))
	c := newCreditChecker(t, addr, []uint32{65535, 1000, 16384, 1 << 20}[rng.Intn(4)], []time.Duration{0, 0, 20 * time.Millisecond}[rng.Intn(3)])
	defer c.r.c.Close()
	streams := 1 + rng.Intn(4)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for s := range streams {
		id := uint32(1 + 2*s)
		srng := rand.New(rand.NewSource(rng.Int63()))
		c.mu.Lock()
		c.win[id] = 65535
		c.mu.Unlock()
		c.write(func(fr *http2.Framer) error { c.r.headers(id, adsPath, false); return nil })
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := 0
			rounds := 1 + srng.Intn(4)
			ended := false
			for round := range rounds {
				batch := 1 + srng.Intn(3)
				for b := range batch {
					var size int
					switch srng.Intn(8) {
					case 0:
						size = 65535
					case 1:
						size = 65535 * (1 + srng.Intn(3))
					case 2:
						size = 16384 * (1 + srng.Intn(5))
					case 3:
						size = 1 << 20
					case 4:
						size = maxMessage - 2000 + srng.Intn(2000)
					default:
						size = srng.Intn(70000)
					}
					m := requestOf(fmt.Sprintf("cr-%d-%d-%d-%d", seed, id, round, b), size)
					end := round == rounds-1 && b == batch-1 && srng.Intn(2) == 0
					if ok, why := c.sendMsg(srng, id, m, end); !ok {
						if failed.CompareAndSwap(false, true) {
							t.Errorf("seed %d stream %d: round %d request %d of %d bytes (%d answered of %d sent): %s", seed, id, round, b, len(m), c.resp[id], sent, why)
						}
						return
					}
					sent++
					if end {
						ended = true
						break
					}
				}
				c.mu.Lock()
				ok := c.waitFor(10*time.Second, func() bool { return c.resp[id] >= sent })
				got := c.resp[id]
				c.mu.Unlock()
				if !ok {
					if failed.CompareAndSwap(false, true) {
						c.mu.Lock()
						t.Errorf("seed %d stream %d: %d of %d requests answered; windows conn %d stream %d; bad %v", seed, id, got, sent, c.conn, c.win[id], c.bad)
						c.mu.Unlock()
					}
					return
				}
				if ended {
					c.mu.Lock()
					ok := c.waitFor(5*time.Second, func() bool { return c.status[id] != "" })
					c.mu.Unlock()
					if !ok && failed.CompareAndSwap(false, true) {
						t.Errorf("seed %d stream %d: no trailers after END_STREAM", seed, id)
					}
					break
				}
				// Answered: the stream's window is whole again.
				c.mu.Lock()
				ok = c.waitFor(2*time.Second, func() bool { return c.win[id] == 65535 })
				w := c.win[id]
				c.mu.Unlock()
				if !ok {
					if failed.CompareAndSwap(false, true) {
						t.Errorf("seed %d stream %d: after %d requests answered the stream's window is %d, not 65535", seed, id, sent, w)
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Errorf("seed %d: %v", seed, c.bad)
		return false
	}
	for id, st := range c.status {
		if st != "0" {
			t.Errorf("seed %d stream %d: status %s", seed, id, st)
			return false
		}
	}
	return !failed.Load()
}

// TestGRPCGoStress: grpc-go clients subscribe to large name sets
// (1000 names of ~1 KB), re-subscribe rapidly, ACK and NACK, cancel
// streams mid-response, while the engine changes; every subscription
// is answered, no stream fails but by the client's cancel, and the
// server lets go of everything after.
func TestGRPCGoStress(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{})
	models := []string{"st-m0", "st-m1", "st-m2"}
	for i, m := range models {
		route(t, "st-app"+fmt.Sprint(i), m, fmt.Sprintf("10.9.0.%d:80", i+1))
	}
	stop := make(chan struct{})
	var engineChanges atomic.Int64
	go func() { // the engine changes
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
			m := i % len(models)
			var addrs []string
			for j := 0; j <= i%3; j++ {
				addrs = append(addrs, fmt.Sprintf("10.9.%d.%d:80", i%200, j+1))
			}
			route(t, "st-app"+fmt.Sprint(m), models[m], addrs...)
			engineChanges.Add(1)
		}
	}()
	budget := durationEnv("XDS_STRESS_FOR", 5*time.Second)
	deadline := time.Now().Add(budget)
	var wg sync.WaitGroup
	var streams, responses, canceled atomic.Int64
	errs := make(chan string, 100)
	for cl := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
			if err != nil {
				errs <- err.Error()
				return
			}
			defer conn.Close()
			rng := rand.New(rand.NewSource(int64(cl)))
			for it := 0; time.Now().Before(deadline); it++ {
				streams.Add(1)
				if why := stressStream(rng, conn, cl, it, models, &responses, &canceled); why != "" {
					select {
					case errs <- why:
					default:
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	close(errs)
	n := 0
	for e := range errs {
		if n++; n <= 10 {
			t.Error(e)
		}
	}
	t.Logf("%d streams, %d responses, %d cancelled mid-way, %d engine changes", streams.Load(), responses.Load(), canceled.Load(), engineChanges.Load())
	eventually(t, "the server lets go of the clients", func() string { return serverState(s) })
}

func stressStream(rng *rand.Rand, conn *grpc.ClientConn, cl, it int, models []string, responses, canceled *atomic.Int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Sprintf("client %d stream %d: %v", cl, it, err)
	}
	var mu sync.Mutex
	subs := map[string][]string{}
	got := map[string]int{} // responses per type
	want := map[string]int{}
	recvErr := make(chan error, 1)
	sendMu := sync.Mutex{}
	closedSend := false
	send := func(r *discoveryv3.DiscoveryRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		if closedSend {
			return nil
		}
		return st.Send(r)
	}
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			responses.Add(1)
			mu.Lock()
			got[r.TypeUrl]++
			names := subs[r.TypeUrl]
			mu.Unlock()
			ack := &discoveryv3.DiscoveryRequest{TypeUrl: r.TypeUrl, ResourceNames: names, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce}
			if rng := rand.Intn(4); rng == 0 { // NACK
				ack.VersionInfo = ""
				ack.ErrorDetail = &rpcstatus.Status{Code: 3, Message: "no thanks"}
			}
			if err := send(ack); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	types := []string{TypeListener, TypeCluster, TypeRoute, TypeEndpoint}
	steps := 1 + rng.Intn(6)
	cancelAt := -1
	if rng.Intn(3) == 0 {
		cancelAt = rng.Intn(steps)
	}
	for step := range steps {
		typ := types[rng.Intn(len(types))]
		var names []string
		switch {
		case typ == TypeEndpoint:
			for _, m := range models {
				if rng.Intn(2) == 0 {
					names = append(names, "chains/model-to-endpoints/"+m)
				}
			}
			if len(names) == 0 {
				names = []string{"chains/model-to-endpoints/" + models[0]}
			}
		case rng.Intn(2) == 0:
			names = bigNames(fmt.Sprintf("s%d-%d-%d", cl, it, step), 1000, 980)
		default:
			names = bigNames(fmt.Sprintf("s%d-%d-%d", cl, it, step), 1+rng.Intn(20), rng.Intn(100))
		}
		if typ == TypeEndpoint || typ == TypeCluster {
			// Cluster and assignment names are the targets' cluster names.
			for i, n := range names {
				tg, _ := parseTarget(n)
				names[i] = tg.clusterName()
			}
		}
		mu.Lock()
		subs[typ] = names
		want[typ] = got[typ] + 1
		mu.Unlock()
		if err := send(&discoveryv3.DiscoveryRequest{TypeUrl: typ, ResourceNames: names}); err != nil {
			return fmt.Sprintf("client %d stream %d step %d: send: %v", cl, it, step, err)
		}
		if step == cancelAt {
			time.Sleep(time.Duration(rng.Intn(20)) * time.Millisecond)
			cancel()
			canceled.Add(1)
			<-recvErr
			return ""
		}
		// The subscription is answered within 10 s (EDS of an unknown
		// model aside: none here).
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			ok := got[typ] >= want[typ]
			mu.Unlock()
			if ok {
				break
			}
			select {
			case err := <-recvErr:
				return fmt.Sprintf("client %d stream %d step %d (%s): %v", cl, it, step, typ, err)
			case <-time.After(5 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Sprintf("client %d stream %d step %d: no %s response in 10 s", cl, it, step, typ)
			}
		}
	}
	sendMu.Lock()
	closedSend = true
	_ = st.CloseSend()
	sendMu.Unlock()
	select {
	case err := <-recvErr:
		if err != io.EOF {
			return fmt.Sprintf("client %d stream %d: ended %v", cl, it, err)
		}
	case <-time.After(10 * time.Second):
		return fmt.Sprintf("client %d stream %d: no end after CloseSend", cl, it)
	}
	return ""
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

// readThrottled is read, that waits per before it grants the window of
// a DATA frame read (a link of limited bandwidth).
func (c *creditChecker) readThrottled(per time.Duration) {
	grants := make(chan [2]uint32, 1<<16)
	go func() {
		for g := range grants {
			time.Sleep(per * time.Duration(g[1]) / 16384)
			c.write(func(fr *http2.Framer) error {
				_ = fr.WriteWindowUpdate(0, g[1])
				return fr.WriteWindowUpdate(g[0], g[1])
			})
		}
	}()
	defer close(grants)
	for {
		f, err := c.r.fr.ReadFrame()
		c.mu.Lock()
		if err != nil {
			c.closed = true
			c.cond.Broadcast()
			c.mu.Unlock()
			return
		}
		switch f := f.(type) {
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.conn += int64(f.Increment)
			} else {
				c.win[f.StreamID] += int64(f.Increment)
			}
		case *http2.DataFrame:
			id, n := f.StreamID, len(f.Data())
			if n > 0 {
				grants <- [2]uint32{id, uint32(n)}
			}
			b := append(c.buf[id], f.Data()...)
			for len(b) >= 5 {
				m := 5 + int(uint32(b[1])<<24|uint32(b[2])<<16|uint32(b[3])<<8|uint32(b[4]))
				if len(b) < m {
					break
				}
				b = b[m:]
				c.resp[id]++
			}
			c.buf[id] = append([]byte{0}, b...)[1:]
		case *http2.HeadersFrame:
			fields, _ := c.r.dec.DecodeFull(f.HeaderBlockFragment())
			for _, hf := range fields {
				if hf.Name == "grpc-status" {
					c.status[f.StreamID] = hf.Value
					for _, hf := range fields {
						if hf.Name == "grpc-message" {
							c.status[f.StreamID] += " " + hf.Value
						}
					}
				}
			}
		case *http2.RSTStreamFrame:
			c.bad = append(c.bad, fmt.Sprint(f))
		case *http2.GoAwayFrame:
			c.bad = append(c.bad, fmt.Sprintf("%v %q", f, f.DebugData()))
		}
		c.cond.Broadcast()
		c.mu.Unlock()
	}
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

// TestHeldDuringReview: while a request is handled (an access review
// that takes its time, as a TokenAuth review over the network does),
// no whole message waits in inbox: the next request of 1.5 MiB gets its
// credit early, whole, and then a window more. The stream holds two
// whole requests and a window.
func TestHeldDuringReview(t *testing.T) {
	s := New(engine, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
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

// TestCreditModel drives takeLocked / nextLocked / creditLocked as data()
// and run() do, and checks the window the client sees.
func TestCreditModel(t *testing.T) {
	for seed := int64(0); seed < 2000; seed++ {
		if why := creditModel(seed); why != "" {
			t.Fatalf("seed %d: %s", seed, why)
		}
	}
}

func creditModel(seed int64) string {
	rng := rand.New(rand.NewSource(seed))
	c := &h2conn{}
	st := &h2stream{c: c, id: 1, recvWindow: 65535}
	client := int64(65535)
	var log []string
	var queue []byte // bytes to send
	for i := 0; i < 4; i++ {
		n := []int{0, 3, 100, 65530, 70000, 200}[rng.Intn(6)]
		m := make([]byte, 5+n)
		m[1], m[2], m[3], m[4] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
		queue = append(queue, m...)
	}
	blocked := false
	for steps := 0; steps < 100000; steps++ {
		if len(queue) == 0 && st.ready == 0 && !blocked {
			break
		}
		switch rng.Intn(3) {
		case 0: // a frame
			if len(queue) == 0 || client <= 0 {
				continue
			}
			size := min(int64(1+rng.Intn(16384)), client, int64(len(queue)))
			pad := int32(0)
			padded := rng.Intn(4) == 0 && size > 1
			if padded {
				pad = int32(1 + rng.Intn(int(min(size-1, 200))))
				size -= int64(pad)
			}
			p := queue[:size]
			queue = queue[size:]
			n := int32(size) + pad
			client -= int64(n)
			if n > st.recvWindow {
				return fmt.Sprintf("over the window; %v", log)
			}
			st.recvWindow -= n
			credit := pad + st.takeLocked(p)
			if credit > 0 {
				st.recvWindow += credit
				client += int64(credit)
			}
			log = append(log, fmt.Sprintf("frame %d pad %d credit %d (ready %d inbox %d early %d)", size, pad, credit, st.ready, len(st.inbox), st.early))
		case 1: // run
			if blocked {
				continue
			}
			_, msg := st.nextLocked()
			if msg == nil {
				continue
			}
			credit := st.creditLocked(int32(frameHeader + len(msg)))
			if credit > 0 {
				st.recvWindow += credit
				client += int64(credit)
			}
			log = append(log, fmt.Sprintf("take %d credit %d (ready %d inbox %d early %d)", len(msg)+5, credit, st.ready, len(st.inbox), st.early))
			blocked = rng.Intn(2) == 0
		case 2:
			blocked = false
		}
		if client != int64(st.recvWindow) {
			return "drift"
		}
	}
	if st.msgTimer != nil {
		st.msgTimer.Stop()
	}
	if len(queue) > 0 {
		return fmt.Sprintf("stuck with %d bytes to send, window %d: %v", len(queue), client, log[max(0, len(log)-10):])
	}
	if client != 65535 {
		return fmt.Sprintf("window %d after all handled: %v", client, log[max(0, len(log)-12):])
	}
	return ""
}
