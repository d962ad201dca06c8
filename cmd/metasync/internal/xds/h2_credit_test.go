package xds

// The flow-control credit of the server's HTTP/2 checked at random: on
// the real server, with a client that honours the windows, and on the
// accounting's own model.

import (
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
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
			_, _, msg := st.nextLocked()
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
