package consul

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/iidp/metasync/internal/admission"
)

// The reasons of metasync_consul_refused_total for connections.
const (
	refusedConnections      = "connections"
	refusedConnsOfCaller    = "connections_per_caller"
	refusedConnectionsRetry = 1 // Retry-After of a refused connection, in seconds
)

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
	lim := s.limits
	if lim.Connections <= 0 && lim.ConnectionsPerCaller <= 0 {
		return ln
	}
	s.conns = &admission.Pool{
		AtPerCaller: admission.OldestOf,
		AtTotal:     admission.Greediest,
		Refused: func(full admission.Bound, _ string) []byte {
			reason, msg := refusedConnections, fmt.Sprintf("too many connections (at most %d), each serving a request; retry later", lim.Connections)
			if full == admission.PerCaller {
				reason, msg = refusedConnsOfCaller, fmt.Sprintf("too many connections from this address (at most %d), each serving a request; retry later", lim.ConnectionsPerCaller)
			}
			s.refused(reason, msg)
			return admission.HTTPRefusal("text/plain; charset=utf-8", msg+"\n", refusedConnectionsRetry)
		},
		Evicted: func(admission.Bound, string) { s.metrics.evicted.Inc() },
	}
	s.conns.SetBounds(lim.Connections, lim.ConnectionsPerCaller)
	return s.conns.Listener(ln)
}

// openConnections is the number of connections open through Listener.
func (s *Server) openConnections() int {
	if s.conns == nil {
		return 0
	}
	return s.conns.Open()
}

// connState is the HTTPServer's ConnState hook: a connection kept alive
// between requests, or with no request read yet, may be closed to make
// room; one serving a request may not.
func (s *Server) connState(c net.Conn, st http.ConnState) {
	if s.conns != nil {
		s.conns.ConnState(c, st)
	}
}

// spent makes the connection of r, answered and closing after its
// answer (a refusal of its token, a request with a body), the first to
// be closed to make room: it serves no one any more.
func (s *Server) spent(r *http.Request) {
	if s.conns == nil {
		return
	}
	if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
		s.conns.Spent(c)
	}
}

// connContext keeps a request's connection in its context, for spent.
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}
