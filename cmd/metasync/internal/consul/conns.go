package consul

import (
	"container/list"
	"context"
	"fmt"
	"net"
	"net/http"
	gosync "sync"
	"time"
)

// The reasons of metasync_consul_refused_total for connections.
const (
	refusedConnections      = "connections"
	refusedConnsOfCaller    = "connections_per_caller"
	refusedConnectionsRetry = 1 // Retry-After of a refused connection, in seconds
)

// refusalsAnswered bounds the refused connections answered at once (each
// holds its descriptor for up to refusalTimeout); beyond, a refused
// connection is closed without an answer.
const (
	refusalsAnswered = 32
	refusalTimeout   = time.Second
)

// conns is the facade's connection limiter (see Limits.Connections and
// Limits.ConnectionsPerCaller): a listener that counts the connections
// of each remote address and knows which are idle, that is, kept alive
// between requests or with no request read yet.
type conns struct {
	net.Listener
	s        *Server
	refusing chan struct{} // a slot per refusal being answered

	mu     gosync.Mutex
	open   int
	byAddr map[string]int
	idle   list.List // *conn that may be closed to make room, idle longest first
}

// conn is a connection that the limiter counts.
type conn struct {
	net.Conn
	l    *conns
	addr string // the remote address, without port
	once gosync.Once
	// Under l.mu:
	elem     *list.Element // in l.idle while idle
	released bool          // its place went to another, or it closed
}

type connKey struct{}

// Listener returns ln limited to Limits.Connections connections, at most
// Limits.ConnectionsPerCaller of them from one remote address (ln itself
// when neither is set). At the limit of its address, a new connection
// takes the place of that address's connection idle longest; at the
// limit of all, of the idle connection of the address holding the most
// connections (its idle longest). A connection serving a request (a
// blocking query) is never closed so. With none to close, the new
// connection is answered 503 and closed. One caller's connections,
// idle or not, can so never keep the others out: it holds at most its
// share, and what it holds idle goes first. Serve HTTPServer's server on
// it.
func (s *Server) Listener(ln net.Listener) net.Listener {
	if s.limits.Connections <= 0 && s.limits.ConnectionsPerCaller <= 0 {
		return ln
	}
	s.conns = &conns{Listener: ln, s: s, refusing: make(chan struct{}, refusalsAnswered), byAddr: map[string]int{}}
	return s.conns
}

// openConnections is the number of connections open through Listener.
func (s *Server) openConnections() int {
	l := s.conns
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Accept returns the next connection within the limits (see Listener).
func (l *conns) Accept() (net.Conn, error) {
	lim := l.s.limits
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := c.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(addr); err == nil {
			addr = host
		}
		nc := &conn{Conn: c, l: l, addr: addr}
		l.mu.Lock()
		var victim *conn
		switch {
		case lim.ConnectionsPerCaller > 0 && l.byAddr[addr] >= lim.ConnectionsPerCaller:
			victim = l.oldestOf(addr)
			if victim == nil {
				l.mu.Unlock()
				l.refuse(c, refusedConnsOfCaller, fmt.Sprintf("too many connections from this address (at most %d), each serving a request; retry later", lim.ConnectionsPerCaller))
				continue
			}
		case lim.Connections > 0 && l.open >= lim.Connections:
			victim = l.greediest()
			if victim == nil {
				l.mu.Unlock()
				l.refuse(c, refusedConnections, fmt.Sprintf("too many connections (at most %d), each serving a request; retry later", lim.Connections))
				continue
			}
		}
		if victim != nil {
			l.idle.Remove(victim.elem)
			victim.elem = nil
			victim.release()
		}
		l.open++
		l.byAddr[addr]++
		nc.elem = l.idle.PushBack(nc) // no request read yet
		l.mu.Unlock()
		if victim != nil {
			_ = victim.Conn.Close() // its server goroutine sees it closed, and ends
			l.s.metrics.evicted.Inc()
		}
		return nc, nil
	}
}

// oldestOf is addr's idle connection idle longest, or nil (under mu).
func (l *conns) oldestOf(addr string) *conn {
	for e := l.idle.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*conn); c.addr == addr {
			return c
		}
	}
	return nil
}

// greediest is the idle connection, idle longest, of the address that
// holds the most connections among those with one idle, or nil (under
// mu).
func (l *conns) greediest() *conn {
	var best *conn
	most := 0
	for e := l.idle.Front(); e != nil; e = e.Next() {
		c := e.Value.(*conn)
		if n := l.byAddr[c.addr]; n > most {
			best, most = c, n
		}
	}
	return best
}

// release gives the connection's place back (under mu).
func (c *conn) release() {
	if c.released {
		return
	}
	l := c.l
	c.released = true
	l.open--
	if l.byAddr[c.addr]--; l.byAddr[c.addr] <= 0 {
		delete(l.byAddr, c.addr)
	}
}

// Close closes the connection and gives its place back.
func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		l := c.l
		l.mu.Lock()
		defer l.mu.Unlock()
		if c.elem != nil {
			l.idle.Remove(c.elem)
			c.elem = nil
		}
		c.release()
	})
	return err
}

// limited is the limiter's connection that c is (under TLS, the one
// below it), or nil.
func limited(c net.Conn) *conn {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = t.NetConn()
	}
	lc, _ := c.(*conn)
	return lc
}

// connState is the HTTPServer's ConnState hook: a connection kept alive
// between requests, or with no request read yet, may be closed to make
// room; one serving a request may not.
func (l *conns) connState(c net.Conn, st http.ConnState) {
	lc := limited(c)
	if lc == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.released {
		return
	}
	switch st {
	case http.StateNew, http.StateIdle:
		if lc.elem == nil {
			lc.elem = l.idle.PushBack(lc)
		} else {
			l.idle.MoveToBack(lc.elem)
		}
	case http.StateActive, http.StateHijacked:
		if lc.elem != nil {
			l.idle.Remove(lc.elem)
			lc.elem = nil
		}
	}
}

// spent makes the connection of r, answered and closing after its
// answer (a refusal of its token, a request with a body), the first to
// be closed to make room: it serves no one any more.
func (s *Server) spent(r *http.Request) {
	l := s.conns
	if l == nil {
		return
	}
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	lc := limited(c)
	if lc == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.released {
		return
	}
	if lc.elem != nil {
		l.idle.Remove(lc.elem)
	}
	lc.elem = l.idle.PushFront(lc)
}

// connContext keeps a request's connection in its context, for spent.
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// refuse answers a connection beyond a limit, when none can be closed to
// make room: a minimal HTTP 503 with Retry-After, after reading what the
// client sent (a socket closed with unread data is reset, and the client
// may lose the answer), then closes it. A TLS handshake gets no answer:
// plain HTTP would mean nothing to it.
func (l *conns) refuse(c net.Conn, reason, msg string) {
	l.s.refused(reason, msg)
	select {
	case l.refusing <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	go func() {
		defer func() { <-l.refusing }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(refusalTimeout))
		buf := make([]byte, 2048)
		n, _ := c.Read(buf)
		if n > 0 && buf[0] == 0x16 {
			return
		}
		body := msg + "\n"
		_, _ = fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
			refusedConnectionsRetry, len(body), body)
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
