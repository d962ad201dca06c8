package xds

import (
	"fmt"
	"net"
	"strings"
	gosync "sync"
	"time"

	"github.com/iidp/metasync/internal/admission"
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
func (s *Server) SetLimits(l Limits) {
	s.limits = l
	s.gate.pool.SetBounds(l.Connections, l.ConnectionsPerCaller)
}

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
	s.refusals.Count(reason, func() {
		s.log.Warn("xDS refused at a limit (logged at most 3 times every 10 s)", "reason", reason,
			"caller", strings.ReplaceAll(caller, "\x00", " "), "error", msg)
	})
}

// gate counts what each caller holds: connections (in its pool, through
// Listener), streams, names.
type gate struct {
	s    *Server
	once gosync.Once // the pool's policies set
	pool admission.Pool

	mu      gosync.Mutex
	streams admission.Tally
	names   admission.Tally
}

// xconn is a connection of Listener.
type xconn struct {
	net.Conn                 // the connection accepted
	ac       *admission.Conn // its place in the pool
	streams  int             // under gate.mu
}

// Close closes the connection and gives its place back.
func (xc *xconn) Close() error { return xc.ac.Close() }

// handshaken marks the connection's handshake done (TLS, and the
// HTTP/2 preface): from now on it is evicted only as an established
// connection is.
func (xc *xconn) handshaken() { xc.ac.Ready() }

// callerOf is who a client at the address remote is: user (with an
// Authorizer), else the address without port.
func callerOf(remote, user string) string {
	if user != "" {
		user = "user:" + user
	}
	return admission.Caller(user, remote)
}

// admit takes a stream's place for caller on the connection xc (nil
// when not Listener's), or says why not (a refusal reason and message).
// The connection's first stream makes it its caller's.
func (g *gate) admit(xc *xconn, caller string) (release func(), reason, msg string) {
	l := g.s.limits
	g.mu.Lock()
	defer g.mu.Unlock()
	if l.StreamsPerCaller > 0 && g.streams[caller] >= l.StreamsPerCaller {
		return nil, refusedStreams, fmt.Sprintf("too many xDS streams open by this caller (at most %d); retry later", l.StreamsPerCaller)
	}
	if xc != nil {
		switch g.pool.Hold(xc.ac, caller, l.ConnectionsPerCaller, headroom(l.Connections)) {
		case admission.PerCaller:
			return nil, refusedConnsOfCaller, fmt.Sprintf("too many xDS connections of this caller (at most %d); retry later", l.ConnectionsPerCaller)
		case admission.Total:
			return nil, refusedHeadroom, "the xDS server is near its connection limit: the rest is kept for callers without a connection; retry later"
		}
		xc.streams++
	}
	g.streams.Add(caller, 1)
	var once gosync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.streams.Add(caller, -1)
			if xc != nil {
				if xc.streams--; xc.streams == 0 {
					g.pool.SetIdle(xc.ac, true)
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
	if delta > 0 && l.NamesPerCaller > 0 && g.names[caller]+delta > l.NamesPerCaller {
		return false
	}
	g.names.Add(caller, delta)
	return true
}

// Listener returns ln limited to Limits.Connections connections (see
// Limits). Serve the server's Transport on it. At the limit, a new
// connection takes the place of a connection without a stream (see
// victim); with none, it is closed and Accept waits for the next.
func (s *Server) Listener(ln net.Listener) net.Listener {
	g := &s.gate
	g.once.Do(func() {
		// The address's own oldest connection without a stream makes
		// room at its limit: a flood of connections that open no stream
		// never locks out a client of the same address.
		g.pool.AtPerCaller = admission.OldestUnownedOf
		g.pool.AtTotal = victim
		g.pool.Refused = g.refused
		g.pool.Evicted = g.evicted
	})
	g.pool.SetBounds(s.limits.Connections, s.limits.ConnectionsPerCaller)
	return xlistener{g.pool.Listener(ln)}
}

type xlistener struct{ net.Listener }

// Accept returns the next connection within the limit, an *xconn.
func (l xlistener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ac := c.(*admission.Conn)
	return &xconn{Conn: ac.Conn, ac: ac}, nil
}

// refused counts a connection refused at the bound full.
func (g *gate) refused(full admission.Bound, addr string) []byte {
	l := g.s.limits
	if full == admission.PerCaller {
		g.s.refuse(refusedConnsOfCaller, "addr:"+addr, fmt.Sprintf("too many xDS connections without a stream from this address (at most %d)", l.ConnectionsPerCaller))
	} else {
		g.s.refuse(refusedConnections, "addr:"+addr, fmt.Sprintf("every xDS connection (at most %d) carries a stream or is new", l.Connections))
	}
	return nil // closed without an answer
}

// evicted counts the address's oldest connection closed at its limit.
func (g *gate) evicted(full admission.Bound, addr string) {
	if full == admission.PerCaller {
		g.s.refuse(refusedConnsOfCaller, "addr:"+addr, fmt.Sprintf("too many xDS connections without a stream from this address (at most %d): the oldest closed", g.s.limits.ConnectionsPerCaller))
	}
}

// evictAfter is how long a connection without a stream is safe from
// eviction by another address's new connection: time for a client to
// finish its handshake and open its stream (a gRPC client opens it at
// once). Shorter than the HTTP/2 preface's and the TLS handshake's 10 s,
// so that connections that never send one cannot hold every place.
var evictAfter = 3 * time.Second

// victim is the connection without a stream to close for a new one from
// addr: addr's own idle longest, else the oldest whose handshake is not
// done, else another's idle longer than evictAfter, else none. One
// address's flood of connections evicts only its own; a flood of
// handshakes never finished (a slowloris) makes room for any new
// connection; a newcomer that finished its handshake is safe while it
// opens its stream.
func victim(p *admission.Pool, addr string) *admission.Conn {
	return admission.FirstOf(admission.OldestOf, admission.Unready, admission.IdleFor(evictAfter))(p, addr)
}

// openConnections is the number of connections open through Listener.
func (g *gate) openConnections() int { return g.pool.Open() }
