package server

import (
	"container/list"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
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
	refused *prometheus.CounterVec
	evicted prometheus.Counter
	limit   *prometheus.GaugeVec
	conns   prometheus.GaugeFunc
}

func newLimitMetrics(s *Server) *limitMetrics {
	m := &limitMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metasync_http_refused_total",
			Help: "Requests and connections refused at a limit, by reason: streams_per_caller (429), streams (503), connections (503, answered by the listener), explain (429).",
		}, []string{"reason"}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metasync_http_connections_evicted_total",
			Help: "Idle connections (kept alive between requests, or with no request read yet) closed to make room for a new one at the connection limit.",
		}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "metasync_http_limit",
			Help: "The limits in force, by limit (streams, streams_per_caller, connections); 0 for none.",
		}, []string{"limit"}),
	}
	m.conns = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "metasync_http_connections_open",
		Help: "Connections open on the API's listener (when it is limited).",
	}, func() float64 {
		if l := s.connLimiter(); l != nil {
			return float64(l.openCount())
		}
		return 0
	})
	for _, r := range []string{refusedPerCaller, refusedStreams, refusedConnections, refusedExplain} {
		m.refused.WithLabelValues(r)
	}
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
		s.conns = &connLimiter{s: s, max: l.Connections, refusing: make(chan struct{}, refusalsAnswered)}
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
	if c, ok := auth.CallerFrom(r.Context()); ok && c.Name != "" {
		return c.Name
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return "addr:" + r.RemoteAddr
	}
	return "addr:" + host
}

// streamGate counts the open streams, in all and per caller.
type streamGate struct {
	mu       gosync.Mutex
	open     int
	peak     int // the most open at once since the last StreamPeak
	byCaller map[string]int
}

// StreamPeak returns the most change streams that were open at once since
// the last call, and how many are open now: a host that returns memory
// to the kernel after a burst of streams looks for a sharp drop.
func (s *Server) StreamPeak() (peak, now int) {
	g := &s.streamGate
	g.mu.Lock()
	defer g.mu.Unlock()
	peak, now = g.peak, g.open
	g.peak = g.open
	return peak, now
}

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
	g := &s.streamGate
	g.mu.Lock()
	switch {
	case l.StreamsPerCaller > 0 && g.byCaller[caller] >= l.StreamsPerCaller:
		g.mu.Unlock()
		s.refuse(w, r, http.StatusTooManyRequests, refusedPerCaller, streamRetryAfter,
			fmt.Sprintf("too many change streams open by this caller (at most %d); retry later", l.StreamsPerCaller))
		return nil, false
	case l.Streams > 0 && g.open >= l.Streams:
		g.mu.Unlock()
		s.refuse(w, r, http.StatusServiceUnavailable, refusedStreams, streamRetryAfter,
			fmt.Sprintf("too many change streams open (at most %d); retry later", l.Streams))
		return nil, false
	}
	g.open++
	g.peak = max(g.peak, g.open)
	if caller != "" {
		if g.byCaller == nil {
			g.byCaller = map[string]int{}
		}
		g.byCaller[caller]++
	}
	g.mu.Unlock()
	var once gosync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.open--
			if caller != "" {
				if g.byCaller[caller]--; g.byCaller[caller] <= 0 {
					delete(g.byCaller, caller)
				}
			}
			g.mu.Unlock()
		})
	}, true
}

// refuse answers a refusal at a limit: the API's JSON error, with
// Retry-After, counted by reason, and logged (at most every 10 s) with
// the caller, so that an operator finds who wants more than the limits.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, reason string, retryAfter int, msg string) {
	s.limitMetrics.refused.WithLabelValues(reason).Inc()
	s.refusedLog.Do(func() {
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
	l.Listener = ln
	return l
}

// refusalsAnswered bounds the refused connections answered at once (each
// holds its descriptor for up to refusalTimeout); beyond, a refused
// connection is closed without an answer.
const (
	refusalsAnswered = 32
	refusalTimeout   = time.Second
)

// connLimiter is a listener that keeps at most max connections open.
type connLimiter struct {
	net.Listener
	s        *Server
	max      int
	refusing chan struct{} // a slot per refusal being answered

	mu   gosync.Mutex
	open int
	idle list.List // *limitedConn that may be closed to make room, idle longest first
}

// limitedConn is a connection that the limiter counts.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	once gosync.Once
	// Under l.mu:
	elem     *list.Element // in l.idle while idle
	released bool          // its place went to another, or it closed
}

func (l *connLimiter) openCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Accept returns the next connection within the limit. At the limit, a
// new connection takes the place of the one idle longest, closed; with
// none idle, it is refused (see refuse), and Accept waits for the next.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitedConn{Conn: c, l: l}
		l.mu.Lock()
		if l.open < l.max {
			l.open++
			lc.elem = l.idle.PushBack(lc) // no request read yet
			l.mu.Unlock()
			return lc, nil
		}
		if e := l.idle.Front(); e != nil {
			victim := e.Value.(*limitedConn)
			l.idle.Remove(e)
			victim.elem, victim.released = nil, true
			lc.elem = l.idle.PushBack(lc)
			l.mu.Unlock()
			// Its server goroutine sees the connection closed, and ends.
			_ = victim.Conn.Close()
			l.s.limitMetrics.evicted.Inc()
			return lc, nil
		}
		l.mu.Unlock()
		l.refuse(c)
	}
}

// refuse answers a connection beyond the limit, when every connection is
// busy: a minimal HTTP 503 with the API's JSON error and Retry-After,
// after reading what the client sent (a socket closed with unread data is
// reset, and the client may lose the answer), then closes it. A TLS
// handshake gets no answer: plain HTTP would mean nothing to it.
func (l *connLimiter) refuse(c net.Conn) {
	l.s.limitMetrics.refused.WithLabelValues(refusedConnections).Inc()
	l.s.refusedLog.Do(func() {
		l.s.log.Warn("connection refused at the limit: every connection busy (logged at most every 10 s)", "limit", l.max)
	})
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
		body := fmt.Sprintf(`{"error":"too many connections (at most %d); retry later"}`+"\n", l.max)
		_, _ = fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nRetry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
			connectionRetryAfter, len(body), body)
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

// Close closes the connection and gives its place back.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		l := c.l
		l.mu.Lock()
		defer l.mu.Unlock()
		if c.elem != nil {
			l.idle.Remove(c.elem)
			c.elem = nil
		}
		if !c.released {
			c.released = true
			l.open--
		}
	})
	return err
}

// limited returns the limiter's connection that c is (under TLS, the one
// below it), or nil for a connection the limiter did not accept.
func limited(c net.Conn) *limitedConn {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = t.NetConn() // under TLS
	}
	lc, _ := c.(*limitedConn)
	return lc
}

// spent makes a connection whose request is answered and that closes after
// the answer (net/http waits up to half a second before closing) the first
// to be evicted: it serves no one any more.
func (l *connLimiter) spent(c net.Conn) {
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

// connState is the HTTPServer's ConnState hook: a connection kept alive
// between requests, or with no request read yet, may be closed to make
// room; one serving a request (a stream) may not.
func (l *connLimiter) connState(c net.Conn, st http.ConnState) {
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
