package xds

import (
	"container/list"
	"fmt"
	"net"
	"strings"
	gosync "sync"
	"time"
)

// Limits bound what the xDS callers may hold, so that no caller takes
// the server from the others. A caller is the user of its token with an
// Authorizer, else its remote address (without port). A zero field sets
// no bound.
type Limits struct {
	// Connections is the most xDS connections open at once, of all
	// callers: each holds a file descriptor, so the daemon counts it in
	// its one budget of descriptors. At the limit a new connection takes
	// the place of the one without a stream idle longest, which is
	// closed; with none, the new one is closed. The last eighth is kept
	// for callers that hold no connection yet (a caller's first stream).
	Connections int
	// ConnectionsPerCaller is the most connections that carry streams of
	// one caller (a connection is its first stream's caller's), and the
	// most connections without a stream yet from one address: one
	// address's flood of connections evicts only its own.
	ConnectionsPerCaller int
	// StreamsPerCaller is the most ADS streams open at once by one caller.
	StreamsPerCaller int
	// NamesPerCaller is the most resource names (of all types) that one
	// caller's streams follow at once.
	NamesPerCaller int
	// FirstRequest is how long a stream may go without its first
	// DiscoveryRequest before it is ended.
	FirstRequest time.Duration
	// Assignments is the most assignments (by target and zone) that the
	// clients follow together: each costs an engine subscription or two
	// and its encoding (about 25 KiB with a zone), whatever its followers. One caller
	// may start at most a quarter of them. A name beyond is not answered
	// (the client sees it as not existing) until some are let go.
	Assignments int
}

// The defaults of Limits, beyond what a node-local gRPC client fleet
// asks for: a client holds one connection and one stream, following a
// few targets (four names each).
const (
	DefaultConnections          = 4096
	DefaultConnectionsPerCaller = 64
	DefaultStreamsPerCaller     = 256
	DefaultNamesPerCaller       = 10000
	DefaultFirstRequest         = 15 * time.Second
	DefaultAssignments          = 4096
)

// DefaultLimits are the limits of a server that SetLimits did not set.
func DefaultLimits() Limits {
	return Limits{Connections: DefaultConnections, ConnectionsPerCaller: DefaultConnectionsPerCaller,
		StreamsPerCaller: DefaultStreamsPerCaller, NamesPerCaller: DefaultNamesPerCaller, FirstRequest: DefaultFirstRequest,
		Assignments: DefaultAssignments}
}

// SetLimits sets the limits; call it before the server serves.
func (s *Server) SetLimits(l Limits) { s.limits = l }

// The reasons of metasync_xds_refused_total.
const (
	refusedConnections   = "connections"
	refusedConnsOfCaller = "connections_per_caller"
	refusedStreams       = "streams_per_caller"
	refusedNames         = "names_per_caller"
	refusedHeadroom      = "headroom"
	refusedFirstRequest  = "first_request"
	refusedAssignments   = "assignments"
)

var refusalReasons = []string{refusedConnections, refusedConnsOfCaller, refusedStreams, refusedNames, refusedHeadroom, refusedFirstRequest, refusedAssignments}

// codeResourceExhausted is gRPC's RESOURCE_EXHAUSTED: a refusal at a
// limit. codeDeadlineExceeded ends a stream that sent no request in time.
const (
	codeResourceExhausted = 8
	codeDeadlineExceeded  = 4
)

// refuse counts a refusal and logs it (a few lines a minute at most).
func (s *Server) refuse(reason, caller, msg string) {
	s.refused.WithLabelValues(reason).Inc()
	s.limitLog.Do(func() {
		s.log.Warn("xDS refused at a limit (logged at most 3 times every 10 s)", "reason", reason,
			"caller", strings.ReplaceAll(caller, "\x00", " "), "error", msg)
	})
}

// gate counts what each caller holds: connections, streams, names.
type gate struct {
	s *Server

	mu   gosync.Mutex
	open int // connections open (through Listener)
	// incomplete is the connections open whose handshake (TLS, and the
	// HTTP/2 preface) is not done yet: the first to make room.
	incomplete int
	idle       list.List      // *xconn without a stream, idle longest first
	conns      map[string]int // connections owned, by caller
	unowned    map[string]int // connections without an owner yet, by address
	streams    map[string]int
	names      map[string]int
}

// xconn is a connection of Listener.
type xconn struct {
	net.Conn
	g    *gate
	once gosync.Once
	// Under gate.mu:
	elem      *list.Element // in gate.idle while it has no stream
	idleSince time.Time     // when it last had no stream
	addr      string        // the remote address, without port
	owner     string        // its first stream's caller; "": counted in unowned
	streams   int
	closed    bool // closed, or evicted: its place is given back
	ready     bool // its handshake is done
}

// handshaken marks the connection's handshake done (TLS, and the
// HTTP/2 preface): from now on it is evicted only as an established
// connection is.
func (xc *xconn) handshaken() {
	g := xc.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if !xc.ready && !xc.closed {
		g.incomplete--
	}
	xc.ready = true
}

// callerOf is who a client at the address remote is: user (with an
// Authorizer), else the address without port.
func callerOf(remote, user string) string {
	if user != "" {
		return "user:" + user
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return "addr:" + remote
	}
	return "addr:" + host
}

// admit takes a stream's place for caller on the connection xc (nil
// when not Listener's), or says why not (a refusal reason and message).
func (g *gate) admit(xc *xconn, caller string) (release func(), reason, msg string) {
	l := g.s.limits
	g.mu.Lock()
	defer g.mu.Unlock()
	if l.StreamsPerCaller > 0 && g.streams[caller] >= l.StreamsPerCaller {
		return nil, refusedStreams, fmt.Sprintf("too many xDS streams open by this caller (at most %d); retry later", l.StreamsPerCaller)
	}
	if xc != nil && xc.owner == "" && !xc.closed {
		// The connection's first stream makes it its caller's.
		held := g.conns[caller]
		switch {
		case l.ConnectionsPerCaller > 0 && held >= l.ConnectionsPerCaller:
			return nil, refusedConnsOfCaller, fmt.Sprintf("too many xDS connections of this caller (at most %d); retry later", l.ConnectionsPerCaller)
		case l.Connections > 0 && held > 0 && g.open-g.incomplete > l.Connections-headroom(l.Connections):
			// Connections whose handshake is not done do not count:
			// they make room for any new one.
			return nil, refusedHeadroom, "the xDS server is near its connection limit: the rest is kept for callers without a connection; retry later"
		}
		xc.owner = caller
		g.disown(xc.addr)
		if g.conns == nil {
			g.conns = map[string]int{}
		}
		g.conns[caller]++
	}
	if g.streams == nil {
		g.streams = map[string]int{}
	}
	g.streams[caller]++
	if xc != nil {
		xc.streams++
		if xc.elem != nil {
			g.idle.Remove(xc.elem)
			xc.elem = nil
		}
	}
	var once gosync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.streams[caller]--; g.streams[caller] <= 0 {
				delete(g.streams, caller)
			}
			if xc != nil {
				if xc.streams--; xc.streams == 0 && !xc.closed {
					xc.elem, xc.idleSince = g.idle.PushBack(xc), time.Now()
				}
			}
		})
	}, "", ""
}

// headroom is the part of n kept for callers without a connection: an
// eighth, at least 1.
func headroom(n int) int { return max(1, n/8) }

// addNames counts delta more names followed by caller, or reports false
// (and counts nothing) when that would pass the limit.
func (g *gate) addNames(caller string, delta int) bool {
	l := g.s.limits
	g.mu.Lock()
	defer g.mu.Unlock()
	n := g.names[caller] + delta
	if delta > 0 && l.NamesPerCaller > 0 && n > l.NamesPerCaller {
		return false
	}
	if g.names == nil {
		g.names = map[string]int{}
	}
	if n <= 0 {
		delete(g.names, caller)
	} else {
		g.names[caller] = n
	}
	return true
}

// Listener returns ln limited to Limits.Connections connections (see
// Limits). Serve the server's Transport on it.
func (s *Server) Listener(ln net.Listener) net.Listener {
	return &xlistener{Listener: ln, g: &s.gate}
}

type xlistener struct {
	net.Listener
	g *gate
}

// Accept returns the next connection within the limit: at the limit, it
// takes the place of the connection without a stream idle longest; with
// none, it is closed and Accept waits for the next.
func (l *xlistener) Accept() (net.Conn, error) {
	g := l.g
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := c.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(addr); err == nil {
			addr = host
		}
		xc := &xconn{Conn: c, g: g, addr: addr}
		l := g.s.limits
		g.mu.Lock()
		var victim *xconn
		if l.ConnectionsPerCaller > 0 && g.unowned[addr] >= l.ConnectionsPerCaller {
			// The address's own oldest connection without a stream
			// makes room: a flood of connections that open no stream
			// never locks out a client of the same address.
			e := g.oldestUnowned(addr)
			if e == nil {
				g.mu.Unlock()
				_ = c.Close()
				g.s.refuse(refusedConnsOfCaller, "addr:"+addr, fmt.Sprintf("too many xDS connections without a stream from this address (at most %d)", l.ConnectionsPerCaller))
				continue
			}
			victim = e.Value.(*xconn)
			g.idle.Remove(e)
			victim.elem = nil
			victim.release()
			g.s.refuse(refusedConnsOfCaller, "addr:"+addr, fmt.Sprintf("too many xDS connections without a stream from this address (at most %d): the oldest closed", l.ConnectionsPerCaller))
		} else if l.Connections > 0 && g.open >= l.Connections {
			e := g.victim(addr)
			if e == nil {
				g.mu.Unlock()
				_ = c.Close()
				g.s.refuse(refusedConnections, "addr:"+addr, fmt.Sprintf("every xDS connection (at most %d) carries a stream or is new", l.Connections))
				continue
			}
			victim = e.Value.(*xconn)
			g.idle.Remove(e)
			victim.elem = nil
			victim.release()
		}
		g.open++
		g.incomplete++
		if g.unowned == nil {
			g.unowned = map[string]int{}
		}
		g.unowned[addr]++
		xc.elem, xc.idleSince = g.idle.PushBack(xc), time.Now()
		g.mu.Unlock()
		if victim != nil {
			_ = victim.Conn.Close() // its server goroutine sees it closed, and ends
		}
		return xc, nil
	}
}

// evictAfter is how long a connection without a stream is safe from
// eviction by another address's new connection: time for a client to
// finish its handshake and open its stream (a gRPC client opens it at
// once). Shorter than the HTTP/2 preface's and the TLS handshake's 10 s,
// so that connections that never send one cannot hold every place.
var evictAfter = 3 * time.Second

// oldestUnowned is the connection without an owner from addr idle
// longest (under gate.mu), or nil.
func (g *gate) oldestUnowned(addr string) *list.Element {
	for e := g.idle.Front(); e != nil; e = e.Next() {
		if xc := e.Value.(*xconn); xc.addr == addr && xc.owner == "" {
			return e
		}
	}
	return nil
}

// victim is the connection without a stream to close for a new one from
// addr (under gate.mu): addr's own idle longest, else the oldest whose
// handshake is not done, else another's idle longer than evictAfter,
// else none. One address's flood of connections evicts only its own;
// a flood of handshakes never finished (a slowloris) makes room for
// any new connection; a newcomer that finished its handshake is safe
// while it opens its stream.
func (g *gate) victim(addr string) *list.Element {
	for e := g.idle.Front(); e != nil; e = e.Next() {
		if xc := e.Value.(*xconn); xc.addr == addr {
			return e
		}
	}
	if g.incomplete > 0 {
		for e := g.idle.Front(); e != nil; e = e.Next() {
			if xc := e.Value.(*xconn); !xc.ready {
				return e
			}
		}
	}
	old := time.Now().Add(-evictAfter)
	for e := g.idle.Front(); e != nil; e = e.Next() {
		if xc := e.Value.(*xconn); xc.idleSince.Before(old) {
			return e
		}
	}
	return nil
}

// disown uncounts a connection from addr that had no owner (under
// gate.mu).
func (g *gate) disown(addr string) {
	if g.unowned[addr]--; g.unowned[addr] <= 0 {
		delete(g.unowned, addr)
	}
}

// release gives the connection's place back (under gate.mu).
func (xc *xconn) release() {
	if xc.closed {
		return
	}
	g := xc.g
	xc.closed = true
	g.open--
	if !xc.ready {
		g.incomplete--
	}
	if xc.owner == "" {
		g.disown(xc.addr)
	} else if g.conns[xc.owner]--; g.conns[xc.owner] <= 0 {
		delete(g.conns, xc.owner)
	}
}

// Close closes the connection and gives its place back.
func (xc *xconn) Close() error {
	err := xc.Conn.Close()
	xc.once.Do(func() {
		g := xc.g
		g.mu.Lock()
		defer g.mu.Unlock()
		if xc.elem != nil {
			g.idle.Remove(xc.elem)
			xc.elem = nil
		}
		xc.release()
	})
	return err
}

// openConnections is the number of connections open through Listener.
func (g *gate) openConnections() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}
