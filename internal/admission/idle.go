package admission

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// SetIdle says whether c may be closed to make room: idle, it goes to
// the end of the idle (the last to be picked by IdleLongest); busy, it
// leaves them. A connection whose place is given back stays as it is.
func (p *Pool) SetIdle(c *Conn, idle bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setIdle(c, idle)
}

func (p *Pool) setIdle(c *Conn, idle bool) {
	if c.released {
		return
	}
	switch {
	case idle && c.elem == nil:
		c.elem, c.idleSince = p.idle.PushBack(c), time.Now()
	case idle:
		p.idle.MoveToBack(c.elem)
		c.idleSince = time.Now()
	case c.elem != nil:
		p.idle.Remove(c.elem)
		c.elem = nil
	}
}

// Spent makes c (under TLS, the one below it), answered and closing
// after its answer, the first to be closed to make room: it serves no
// one any more. A connection of no pool is left alone.
func (p *Pool) Spent(c net.Conn) {
	pc := ConnOf(c)
	if pc == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc.released {
		return
	}
	if pc.elem != nil {
		p.idle.Remove(pc.elem)
	}
	pc.elem = p.idle.PushFront(pc)
}

// ConnState is an http.Server's ConnState hook: a connection kept alive
// between requests, or with no request read yet, may be closed to make
// room; one serving a request may not.
func (p *Pool) ConnState(c net.Conn, st http.ConnState) {
	pc := ConnOf(c)
	if pc == nil {
		return
	}
	switch st {
	case http.StateNew, http.StateIdle:
		p.SetIdle(pc, true)
	case http.StateActive, http.StateHijacked:
		p.SetIdle(pc, false)
	}
}

// Hold makes c busy for owner (a stream of owner on it), and claims it
// for owner when it has no owner yet: from then on it counts as owner's,
// no longer against its address. The claim is refused, and c left as it
// is, when owner holds perOwner connections already (PerCaller), or
// holds one and the connections whose handshake is done are past the
// pool's most less reserve (Total): the last reserve places are kept for
// owners without a connection. 0 bounds nothing.
func (p *Pool) Hold(c *Conn, owner string, perOwner, reserve int) Bound {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.owner == "" && !c.released {
		held := p.owned[owner]
		switch {
		case perOwner > 0 && held >= perOwner:
			return PerCaller
		case p.total > 0 && held > 0 && p.open-p.incomplete > p.total-reserve:
			// Connections whose handshake is not done do not count:
			// they make room for any new one.
			return Total
		}
		c.owner = owner
		p.unowned.Add(c.addr, -1)
		p.owned.Add(owner, 1)
	}
	if c.elem != nil {
		p.idle.Remove(c.elem)
		c.elem = nil
	}
	return 0
}

// Open is the number of connections open in the pool.
func (p *Pool) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// Held describes what the pool holds, "" when nothing.
func (p *Pool) Held() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open == 0 && p.idle.Len() == 0 && len(p.owned) == 0 && len(p.unowned) == 0 {
		return ""
	}
	return fmt.Sprintf("conns %v unowned %v open %d idle %d", p.owned, p.unowned, p.open, p.idle.Len())
}

// IdleLongest picks the connection idle longest.
func IdleLongest(p *Pool, _ string) *Conn {
	if e := p.idle.Front(); e != nil {
		return e.Value.(*Conn)
	}
	return nil
}

// OldestOf picks addr's connection idle longest.
func OldestOf(p *Pool, addr string) *Conn {
	return p.first(func(c *Conn) bool { return c.addr == addr })
}

// OldestUnownedOf picks addr's unclaimed connection idle longest: a
// flood of connections from one address evicts only its own.
func OldestUnownedOf(p *Pool, addr string) *Conn {
	return p.first(func(c *Conn) bool { return c.addr == addr && c.owner == "" })
}

// Unready picks the connection idle longest whose handshake is not done:
// a flood of handshakes never finished makes room for any new one.
func Unready(p *Pool, _ string) *Conn {
	if p.incomplete == 0 {
		return nil
	}
	return p.first(func(c *Conn) bool { return !c.ready })
}

// IdleFor picks the connection idle longest, if idle for longer than d:
// a newcomer is safe for d while it opens its first stream.
func IdleFor(d time.Duration) Policy {
	return func(p *Pool, _ string) *Conn {
		old := time.Now().Add(-d)
		return p.first(func(c *Conn) bool { return c.idleSince.Before(old) })
	}
}

// Greediest picks the idle connection, idle longest, of the address that
// holds the most unclaimed connections among those with one idle: one
// address's connections, idle or not, never keep the others out.
func Greediest(p *Pool, _ string) *Conn {
	var best *Conn
	most := 0
	for e := p.idle.Front(); e != nil; e = e.Next() {
		c := e.Value.(*Conn)
		if n := p.unowned[c.addr]; n > most {
			best, most = c, n
		}
	}
	return best
}

// FirstOf picks what the first of policies that picks one picks.
func FirstOf(policies ...Policy) Policy {
	return func(p *Pool, addr string) *Conn {
		for _, pick := range policies {
			if c := pick(p, addr); c != nil {
				return c
			}
		}
		return nil
	}
}

// first is the idle connection, idle longest, that ok picks (under mu).
func (p *Pool) first(ok func(*Conn) bool) *Conn {
	for e := p.idle.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*Conn); ok(c) {
			return c
		}
	}
	return nil
}
