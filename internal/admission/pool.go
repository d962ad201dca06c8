package admission

import (
	"container/list"
	"fmt"
	"net"
	gosync "sync"
	"time"
)

// Pool keeps the connections of its listeners (see Listener) within a
// budget: each holds a file descriptor. A new connection beyond a bound
// takes the place of an idle one, which is closed: the Policy of the
// bound picks which. With none to close, it is refused.
//
// A connection is idle from its accept until SetIdle or Hold says
// otherwise; one that is busy (serving a request, carrying a stream) is
// never closed to make room. A connection may be claimed by the caller
// it serves (Hold): until then it counts against its remote address.
type Pool struct {
	// AtTotal picks the connection to close for a new one when the pool
	// holds its most (nil: IdleLongest).
	AtTotal Policy
	// AtPerCaller picks it when the new one's address holds its most
	// unclaimed connections (nil: OldestUnownedOf).
	AtPerCaller Policy
	// Refused is told of a connection refused at the bound full, from
	// addr (its remote address without port), before it is answered;
	// it returns the answer, or nil to close the connection at once. An
	// answer is written after what the client sent is read (a socket
	// closed with unread data is reset, and the client may lose the
	// answer), never to a TLS handshake, and at most Answering at once.
	Refused func(full Bound, addr string) (answer []byte)
	// Evicted is told of a connection closed to make room for a new one
	// from addr at the bound full, just before it is closed.
	Evicted func(full Bound, addr string)

	mu         gosync.Mutex
	total      int // the most connections open; 0: no bound
	perCaller  int // the most unclaimed connections of one address; 0: no bound
	open       int
	incomplete int       // connections open whose handshake is not done
	unowned    Tally     // connections unclaimed, by address
	owned      Tally     // connections claimed, by owner
	idle       list.List // *Conn that may be closed to make room, idle longest first
	refusing   chan struct{}
}

// Refused connections answered at once (each holds its descriptor for up
// to AnswerTimeout); beyond, a refused connection is closed without an
// answer.
const (
	Answering     = 32
	AnswerTimeout = time.Second
)

// Policy picks the idle connection to close for a new one from addr
// (called with the pool locked), or nil for none.
type Policy func(p *Pool, addr string) *Conn

// Conn is a connection that the pool counts.
type Conn struct {
	net.Conn
	p    *Pool
	addr string
	once gosync.Once
	// Under p.mu:
	elem      *list.Element // in p.idle while idle
	idleSince time.Time     // when it last became idle
	owner     string        // "": unclaimed, counted by address
	released  bool          // its place went to another, or it closed
	ready     bool          // its handshake is done
}

// SetBounds sets the most connections open, and the most unclaimed
// connections of one remote address; 0 bounds nothing.
func (p *Pool) SetBounds(total, perCaller int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total, p.perCaller = total, perCaller
}

// Listener returns ln limited by the pool. A pool may serve several.
func (p *Pool) Listener(ln net.Listener) net.Listener { return &listener{Listener: ln, p: p} }

type listener struct {
	net.Listener
	p *Pool
}

// Accept returns the next connection within the bounds, a *Conn. At a
// bound, the new connection takes the place of the one its policy
// picks; with none, it is refused, and Accept waits for the next.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if nc := l.p.admit(c); nc != nil {
			return nc, nil
		}
	}
}

// admit counts c in the pool, or refuses it (nil).
func (p *Pool) admit(c net.Conn) *Conn {
	addr := Host(c.RemoteAddr().String())
	p.mu.Lock()
	var full Bound
	var victim *Conn
	switch {
	case p.perCaller > 0 && p.unowned[addr] >= p.perCaller:
		full, victim = PerCaller, pick(p.AtPerCaller, OldestUnownedOf)(p, addr)
	case p.total > 0 && p.open >= p.total:
		full, victim = Total, pick(p.AtTotal, IdleLongest)(p, addr)
	}
	if full != 0 && victim == nil {
		p.mu.Unlock()
		p.refuse(c, full, addr)
		return nil
	}
	if victim != nil {
		p.idle.Remove(victim.elem)
		victim.elem = nil
		victim.release()
	}
	nc := &Conn{Conn: c, p: p, addr: addr}
	p.open++
	p.incomplete++
	p.unowned.Add(addr, 1)
	nc.elem, nc.idleSince = p.idle.PushBack(nc), time.Now() // no request read yet
	p.mu.Unlock()
	if victim != nil {
		if p.Evicted != nil {
			p.Evicted(full, addr)
		}
		_ = victim.Conn.Close() // its server goroutine sees it closed, and ends
	}
	return nc
}

func pick(p, otherwise Policy) Policy {
	if p != nil {
		return p
	}
	return otherwise
}

// refuse tells Refused of c, and answers c or closes it.
func (p *Pool) refuse(c net.Conn, full Bound, addr string) {
	var answer []byte
	if p.Refused != nil {
		answer = p.Refused(full, addr)
	}
	if answer == nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.refusing == nil {
		p.refusing = make(chan struct{}, Answering)
	}
	refusing := p.refusing
	p.mu.Unlock()
	select {
	case refusing <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	go func() {
		defer func() { <-refusing }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(AnswerTimeout))
		buf := make([]byte, 2048)
		n, _ := c.Read(buf)
		if n > 0 && buf[0] == 0x16 {
			return // a TLS handshake
		}
		_, _ = c.Write(answer)
		if tc, ok := c.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}()
}

// HTTPRefusal is a minimal HTTP/1.1 503 answer of body, of contentType,
// with Retry-After and the extra header lines given ("Name: value").
func HTTPRefusal(contentType, body string, retryAfter int, extra ...string) []byte {
	head := "HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + contentType + "\r\n"
	for _, h := range extra {
		head += h + "\r\n"
	}
	return fmt.Appendf(nil, "%sRetry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		head, retryAfter, len(body), body)
}

// release gives the connection's place back (under p.mu).
func (c *Conn) release() {
	if c.released {
		return
	}
	p := c.p
	c.released = true
	p.open--
	if !c.ready {
		p.incomplete--
	}
	if c.owner == "" {
		p.unowned.Add(c.addr, -1)
	} else {
		p.owned.Add(c.owner, -1)
	}
}

// Close closes the connection and gives its place back.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		p := c.p
		p.mu.Lock()
		defer p.mu.Unlock()
		if c.elem != nil {
			p.idle.Remove(c.elem)
			c.elem = nil
		}
		c.release()
	})
	return err
}

// Addr is the connection's remote address, without port.
func (c *Conn) Addr() string { return c.addr }

// Ready marks the connection's handshake done (TLS, a protocol's
// preface): Unready no longer picks it.
func (c *Conn) Ready() {
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if !c.ready && !c.released {
		p.incomplete--
	}
	c.ready = true
}

// ConnOf is the pool's connection that c is (under TLS, the one below
// it), or nil for a connection no pool accepted.
func ConnOf(c net.Conn) *Conn {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = t.NetConn() // under TLS
	}
	pc, _ := c.(*Conn)
	return pc
}
