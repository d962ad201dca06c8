package consul

import (
	"fmt"
	"net/http"

	"github.com/iidp/metasync/internal/admission"
)

// Limits bound the blocking queries that callers may hold open at once,
// and the connections. A blocking query holds a connection and a
// goroutine for up to its wait; the engine subscriptions behind them are
// shared per service. A zero field sets no bound.
type Limits struct {
	// Blocking is the most blocking queries open at once, of all
	// callers; beyond, 503 with Retry-After.
	Blocking int
	// BlockingPerCaller is the most that one caller may hold open: behind
	// an Authorizer, one user; without, one remote address. Beyond, 429
	// with Retry-After.
	BlockingPerCaller int
	// Connections is the most connections open at once (see Listener):
	// each holds a file descriptor, so the daemon takes them from its one
	// budget of descriptors.
	Connections int
	// ConnectionsPerCaller is the most connections open at once from one
	// remote address.
	ConnectionsPerCaller int
}

// The default limits: as the HTTP API's change streams; a caller's
// connections are its blocking queries' and Room more, for reads that
// answer at once.
const (
	DefaultBlocking             = 4096
	DefaultBlockingPerCaller    = 256
	Room                        = 64
	DefaultConnections          = DefaultBlocking + Room
	DefaultConnectionsPerCaller = DefaultBlockingPerCaller + Room
)

// DefaultLimits are the limits of a new Server.
func DefaultLimits() Limits {
	return Limits{Blocking: DefaultBlocking, BlockingPerCaller: DefaultBlockingPerCaller,
		Connections: DefaultConnections, ConnectionsPerCaller: DefaultConnectionsPerCaller}
}

// SetLimits sets the limits; call it before the server serves.
func (s *Server) SetLimits(l Limits) { s.limits = l }

// The reasons of metasync_consul_refused_total.
const (
	refusedBlocking  = "blocking"
	refusedPerCaller = "blocking_per_caller"
	// refusedServices: a caller left more idle watches than
	// maxIdlePerCaller; its idle longest stopped.
	refusedServices = "services_per_caller"
)

// gate counts the open blocking queries, in all and per caller.
type gate struct {
	s *Server
	admission.Gate
}

// callerOf names the caller of r for the limits: its user behind an
// Authorizer, else its remote address (without the port).
func callerOf(r *http.Request, user string) string {
	if user != "" {
		user = "user:" + user
	}
	return admission.Caller(user, r.RemoteAddr)
}

// admit takes a blocking query's place for caller, or says why not (a
// refusal reason and message).
func (g *gate) admit(caller string) (release func(), reason, msg string) {
	l := g.s.limits
	release, full := g.Admit(caller, l.Blocking, l.BlockingPerCaller)
	switch {
	case full&admission.Total != 0:
		return nil, refusedBlocking, fmt.Sprintf("too many blocking queries open (%d, all callers): try again later", l.Blocking)
	case full != 0:
		return nil, refusedPerCaller, fmt.Sprintf("too many blocking queries open from this caller (%d): try again later", l.BlockingPerCaller)
	}
	return release, "", ""
}

// refused counts a refusal and logs it (at most a few times a minute).
func (s *Server) refused(reason, msg string) {
	s.metrics.refusals.Count(reason, func() {
		s.log.Warn("Consul facade: refused at a limit", "reason", reason, "error", msg)
	})
}
