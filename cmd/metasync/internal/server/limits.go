package server

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/internal/admission"
)

// Limits bound what the callers of the API may hold open at once. A zero
// field sets no bound.
//
// A change stream holds its connection (HTTP/1.1) for as long as it runs,
// and every connection holds a file descriptor. Connections bounds them
// all, below the process's descriptor limit, so that accepting never fails
// for want of one; Streams bounds the streams below Connections, so that
// the room between the two is always there for lookups and probes.
type Limits struct {
	// Streams is the most change streams (?watch=true) open at once, of
	// all callers. Beyond it a stream is refused with 503.
	Streams int
	// StreamsPerCaller is the most change streams that one caller may
	// hold open at once: behind TokenAuth, one identity (its user name,
	// and its pod for a token bound to one); without, one remote address.
	// Beyond it a stream is refused with 429.
	StreamsPerCaller int
	// Connections is the most connections that the listener of
	// Server.Listener keeps open. A new connection beyond it takes the
	// place of the one idle longest (kept alive between requests, or with
	// no request read yet), which is closed; when every connection is
	// busy, it is answered 503 and closed.
	Connections int
}

// Retry-After of the refusals, in seconds: a stream's caller may come
// back once some stream has ended; a connection's at once, nearly.
const (
	streamRetryAfter     = 5
	connectionRetryAfter = 1
)

// The reasons of metasync_http_refused_total.
const (
	refusedPerCaller   = "streams_per_caller"
	refusedStreams     = "streams"
	refusedConnections = "connections"
	// refusedExplain: ?explain=true over its rate (ExplainRate), 429.
	refusedExplain = "explain"
)

// limitMetrics count what the limits turn away.
type limitMetrics struct {
	refusals *admission.Refusals // logged at most every 10 s
	refused  *prometheus.CounterVec
	evicted  prometheus.Counter
	limit    *prometheus.GaugeVec
	conns    prometheus.GaugeFunc
}

func newLimitMetrics(s *Server) *limitMetrics {
	m := &limitMetrics{
		refusals: admission.NewRefusals(prometheus.CounterOpts{
			Name: "metasync_http_refused_total",
			Help: "Requests and connections refused at a limit, by reason: streams_per_caller (429), streams (503), connections (503, answered by the listener), explain (429).",
		}, []string{refusedPerCaller, refusedStreams, refusedConnections, refusedExplain}, 1, 10*time.Second),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metasync_http_connections_evicted_total",
			Help: "Idle connections (kept alive between requests, or with no request read yet) closed to make room for a new one at the connection limit.",
		}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "metasync_http_limit",
			Help: "The limits in force, by limit (streams, streams_per_caller, connections); 0 for none.",
		}, []string{"limit"}),
	}
	m.refused = m.refusals.Metric
	m.conns = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "metasync_http_connections_open",
		Help: "Connections open on the API's listener (when it is limited).",
	}, func() float64 {
		if l := s.connLimiter(); l != nil {
			return float64(l.openCount())
		}
		return 0
	})
	for _, l := range []string{refusedStreams, refusedPerCaller, refusedConnections} {
		m.limit.WithLabelValues(l)
	}
	return m
}

func (m *limitMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.refused, m.evicted, m.limit, m.conns}
}

// SetLimits sets the limits on streams and connections. Call it before
// HTTPServer and Listener.
func (s *Server) SetLimits(l Limits) {
	s.limitsMu.Lock()
	defer s.limitsMu.Unlock()
	s.limits = l
	if l.Connections > 0 {
		s.conns = newConnLimiter(s, l.Connections)
	} else {
		s.conns = nil
	}
	s.limitMetrics.limit.WithLabelValues(refusedStreams).Set(float64(l.Streams))
	s.limitMetrics.limit.WithLabelValues(refusedPerCaller).Set(float64(l.StreamsPerCaller))
	s.limitMetrics.limit.WithLabelValues(refusedConnections).Set(float64(l.Connections))
}

func (s *Server) connLimiter() *connLimiter {
	s.limitsMu.Lock()
	defer s.limitsMu.Unlock()
	return s.conns
}

// callerOf is who a request comes from, for the per-caller limit: the
// identity that TokenAuth found, else the remote address (without port).
func callerOf(r *http.Request) string {
	name := ""
	if c, ok := auth.CallerFrom(r.Context()); ok {
		name = c.Name
	}
	return admission.Caller(name, r.RemoteAddr)
}

// StreamPeak returns the most change streams that were open at once since
// the last call, and how many are open now: a host that returns memory
// to the kernel after a burst of streams looks for a sharp drop.
func (s *Server) StreamPeak() (peak, now int) { return s.streamGate.Peak() }

// admitStream takes a stream's place under the limits, or answers the
// refusal (429 or 503, with Retry-After) and reports false. release gives
// the place back.
func (s *Server) admitStream(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	s.limitsMu.Lock()
	l := s.limits
	s.limitsMu.Unlock()
	caller := ""
	if l.StreamsPerCaller > 0 {
		caller = callerOf(r)
	}
	release, full := s.streamGate.Admit(caller, l.Streams, l.StreamsPerCaller)
	switch {
	case full&admission.PerCaller != 0:
		s.refuse(w, r, http.StatusTooManyRequests, refusedPerCaller, streamRetryAfter,
			fmt.Sprintf("too many change streams open by this caller (at most %d); retry later", l.StreamsPerCaller))
		return nil, false
	case full != 0:
		s.refuse(w, r, http.StatusServiceUnavailable, refusedStreams, streamRetryAfter,
			fmt.Sprintf("too many change streams open (at most %d); retry later", l.Streams))
		return nil, false
	}
	return release, true
}

// refuse answers a refusal at a limit: the API's JSON error, with
// Retry-After, counted by reason, and logged (at most every 10 s) with
// the caller, so that an operator finds who wants more than the limits.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, reason string, retryAfter int, msg string) {
	s.limitMetrics.refusals.Count(reason, func() {
		s.log.Warn("stream refused at a limit (logged at most every 10 s)", "reason", reason, "status", code,
			"caller", strings.ReplaceAll(callerOf(r), "\x00", " "), "error", msg)
	})
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	writeError(w, code, msg)
}

// Listener returns ln limited to Limits.Connections connections (ln itself
// when there is no such limit). Serve the HTTPServer on it: HTTPServer
// tells the limiter which connections are idle.
func (s *Server) Listener(ln net.Listener) net.Listener {
	l := s.connLimiter()
	if l == nil {
		return ln
	}
	return l.Listener(ln)
}

// connLimiter keeps at most max connections open. At the limit, a new
// connection takes the place of the one idle longest (kept alive between
// requests, or with no request read yet; one whose answer closes it
// first: see Spent), closed; with none idle, it is answered a minimal
// HTTP 503 with the API's JSON error and Retry-After, then closed. A TLS
// handshake gets no answer: plain HTTP would mean nothing to it.
type connLimiter struct {
	*admission.Pool
}

func newConnLimiter(s *Server, max int) *connLimiter {
	p := &admission.Pool{
		Refused: func(admission.Bound, string) []byte {
			s.limitMetrics.refusals.Count(refusedConnections, func() {
				s.log.Warn("connection refused at the limit: every connection busy (logged at most every 10 s)", "limit", max)
			})
			body := fmt.Sprintf(`{"error":"too many connections (at most %d); retry later"}`+"\n", max)
			return admission.HTTPRefusal("application/json", body, connectionRetryAfter, "Cache-Control: no-store")
		},
		Evicted: func(admission.Bound, string) { s.limitMetrics.evicted.Inc() },
	}
	p.SetBounds(max, 0)
	return &connLimiter{Pool: p}
}

func (l *connLimiter) openCount() int { return l.Open() }
