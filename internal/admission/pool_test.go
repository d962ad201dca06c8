package admission

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// testPool serves p on a loopback listener whose accepted connections
// come out of the returned channel.
func testPool(t *testing.T, p *Pool) (addr string, accepted <-chan *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := p.Listener(ln)
	t.Cleanup(func() { lim.Close() })
	ch := make(chan *Conn, 64)
	go func() {
		for {
			c, err := lim.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			ch <- c.(*Conn)
		}
	}()
	return ln.Addr().String(), ch
}

// dial connects to addr from the loopback address from (127.0.0.X).
func dial(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func next(t *testing.T, ch <-chan *Conn) *Conn {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
		return nil
	}
}

// closed reports whether the server closed c (within a second).
func closed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF
}

// events records the pool's hooks.
type events struct {
	mu      sync.Mutex
	refused []Bound
	evicted []Bound
}

func (e *events) hooks(p *Pool, answer []byte) {
	p.Refused = func(full Bound, _ string) []byte {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.refused = append(e.refused, full)
		return answer
	}
	p.Evicted = func(full Bound, _ string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.evicted = append(e.evicted, full)
	}
}

func (e *events) counts() (refused, evicted int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.refused), len(e.evicted)
}

// TestIdleLongestAndRefusal: at the bound a new connection takes the
// place of the one idle longest; with every one busy it is answered and
// closed; a spent one goes first.
func TestIdleLongestAndRefusal(t *testing.T) {
	p := &Pool{}
	var ev events
	ev.hooks(p, HTTPRefusal("application/json", "{}\n", 1, "Cache-Control: no-store"))
	p.SetBounds(2, 0)
	addr, ch := testPool(t, p)
	c1 := dial(t, addr, "127.0.0.1")
	a1 := next(t, ch)
	c2 := dial(t, addr, "127.0.0.1")
	a2 := next(t, ch)
	p.ConnState(a2, http.StateActive)
	c3 := dial(t, addr, "127.0.0.1")
	a3 := next(t, ch)
	if !closed(c1) {
		t.Fatal("the connection idle longest was not closed")
	}
	if closed(c2) {
		t.Fatal("a busy connection was closed")
	}
	if p.Open() != 2 {
		t.Fatalf("%d open", p.Open())
	}
	_ = a1
	// Both busy: the next is answered 503.
	p.ConnState(a3, http.StateActive)
	c4 := dial(t, addr, "127.0.0.1")
	_, _ = io.WriteString(c4, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c4), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("refusal: %d %v", resp.StatusCode, resp.Header)
	}
	if r, e := ev.counts(); r != 1 || e != 1 {
		t.Fatalf("refused %d evicted %d, want 1 1", r, e)
	}
	// A spent connection is the first to go, busy or not.
	p.Spent(a3)
	dial(t, addr, "127.0.0.1")
	next(t, ch)
	if !closed(c3) {
		t.Fatal("the spent connection was not closed first")
	}
	if closed(c2) {
		t.Fatal("a busy connection was closed")
	}
}

// TestPerAddress: one address at its bound evicts its own, unclaimed,
// idle longest, and is refused (closed without an answer) when all of
// its own are busy; another address is not held back.
func TestPerAddress(t *testing.T) {
	p := &Pool{}
	var ev events
	ev.hooks(p, nil)
	p.SetBounds(0, 2)
	addr, ch := testPool(t, p)
	c1 := dial(t, addr, "127.0.0.1")
	a1 := next(t, ch)
	dial(t, addr, "127.0.0.1")
	a2 := next(t, ch)
	if a1.Addr() != "127.0.0.1" {
		t.Fatalf("Addr %q", a1.Addr())
	}
	dial(t, addr, "127.0.0.2")
	next(t, ch)
	dial(t, addr, "127.0.0.1")
	a3 := next(t, ch)
	if !closed(c1) {
		t.Fatal("the address's oldest was not closed")
	}
	p.SetIdle(a2, false)
	p.SetIdle(a3, false)
	c4 := dial(t, addr, "127.0.0.1")
	if !closed(c4) {
		t.Fatal("a connection over its address's bound, all busy, was kept")
	}
	if r, e := ev.counts(); r != 1 || e != 1 || ev.refused[0] != PerCaller || ev.evicted[0] != PerCaller {
		t.Fatalf("refused %v evicted %v", ev.refused, ev.evicted)
	}
	// A claimed connection counts as its owner's, not its address's.
	if full := p.Hold(a2, "user:a", 1, 0); full != 0 {
		t.Fatal(full)
	}
	dial(t, addr, "127.0.0.1")
	next(t, ch)
	if p.Open() != 4 {
		t.Fatalf("%d open, want 4", p.Open())
	}
}

// TestHold: claims are bounded per owner and by the reserve, and a
// connection let go becomes idle again.
func TestHold(t *testing.T) {
	p := &Pool{}
	p.SetBounds(8, 0)
	addr, ch := testPool(t, p)
	var cs []*Conn
	for range 8 {
		dial(t, addr, "127.0.0.1")
		c := next(t, ch)
		c.Ready()
		cs = append(cs, c)
	}
	if full := p.Hold(cs[0], "a", 2, 1); full != 0 {
		t.Fatal(full)
	}
	if full := p.Hold(cs[0], "a", 2, 1); full != 0 {
		t.Fatal("a second hold of the same connection", full)
	}
	// Eight established, the reserve of one: a holds one, gets no more.
	if full := p.Hold(cs[1], "a", 2, 1); full != Total {
		t.Fatalf("a past the reserve: %v, want Total", full)
	}
	if full := p.Hold(cs[1], "b", 2, 1); full != 0 {
		t.Fatalf("b's first: %v", full)
	}
	if full := p.Hold(cs[2], "b", 1, 0); full != PerCaller {
		t.Fatalf("b's second of at most 1: %v, want PerCaller", full)
	}
	// The held are not picked; let go, cs[0] is the last picked.
	if c := IdleLongest(p, ""); c != cs[2] {
		t.Fatalf("IdleLongest picked %p, want cs[2]", c)
	}
	p.SetIdle(cs[0], true)
	p.mu.Lock()
	last := p.idle.Back().Value.(*Conn)
	p.mu.Unlock()
	if last != cs[0] {
		t.Fatal("a connection let go is not the last idle")
	}
	if !strings.Contains(p.Held(), "open 8") {
		t.Fatal(p.Held())
	}
	for _, c := range cs {
		c.Close()
	}
	if h := p.Held(); h != "" {
		t.Fatalf("held after every close: %s", h)
	}
}

// TestPolicies: the pickers, on a pool filled by hand.
func TestPolicies(t *testing.T) {
	p := &Pool{}
	add := func(addr, owner string, ready bool, idleFor time.Duration) *Conn {
		c := &Conn{p: p, addr: addr, owner: owner, ready: ready, idleSince: time.Now().Add(-idleFor)}
		p.open++
		if owner == "" {
			p.unowned.Add(addr, 1)
		} else {
			p.owned.Add(owner, 1)
		}
		c.elem = p.idle.PushBack(c)
		return c
	}
	a1 := add("a", "x", true, time.Second)
	b1 := add("b", "", true, time.Minute)
	a2 := add("a", "", false, time.Second)
	b2 := add("b", "", true, 0)
	_ = add("b", "", true, 0)
	for name, c := range map[string]struct{ got, want *Conn }{
		"IdleLongest":     {IdleLongest(p, ""), a1},
		"OldestOf":        {OldestOf(p, "a"), a1},
		"OldestUnownedOf": {OldestUnownedOf(p, "a"), a2},
		"Unready":         {Unready(p, ""), nil}, // incomplete is 0: nothing to look for
		"IdleFor":         {IdleFor(10*time.Second)(p, ""), b1},
		"Greediest":       {Greediest(p, ""), b1},
		"FirstOf":         {FirstOf(OldestOf, IdleLongest)(p, "c"), a1},
		"none":            {OldestOf(p, "c"), nil},
	} {
		if c.got != c.want {
			t.Errorf("%s picked %v, want %v", name, c.got, c.want)
		}
	}
	p.incomplete = 1
	if c := Unready(p, ""); c != a2 {
		t.Errorf("Unready picked %v, want a2", c)
	}
	_ = b2
}
