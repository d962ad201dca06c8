// Package consul serves the read side of the Consul HTTP API over a
// metasync engine, so that Consul's discovery clients
// (hashicorp/consul/api, Prometheus' consul_sd, Traefik's Consul catalog
// provider, Spring Cloud Consul) find a model's endpoints with no metasync
// code in them.
//
// A service is a key of the chains and indexes the facade is given
// (Source), its instances the key's host:port values; values that are
// not host:port are left out. The facade answers
//
//	GET /v1/agent/self                the datacenter "metasync" and this node
//	GET /v1/catalog/services          {"model1":[],"model2":[]}
//	GET /v1/catalog/service/{name}    one CatalogService per instance
//	GET /v1/health/service/{name}     one ServiceEntry per instance, with one passing check
//
// and refuses everything else with a 4xx: it is read-only. The last three
// take Consul's blocking queries (?index=N&wait=D): the answer waits until
// its index passes N, or D has gone by. The files follow its parts:
// shapes.go what Consul's clients read, watch.go the engine followed for
// the blocking queries (one subscription per service that some query
// waits on, shared by every query of it), handlers.go the routes,
// limits.go what one caller may hold, metrics.go what /metrics shows.
package consul

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/iidp/metasync/internal/admission"
	msync "github.com/iidp/metasync/sync"
)

// Datacenter is the datacenter that the facade names in every answer.
const Datacenter = "metasync"

// Engine is what the facade reads of the engine.
type Engine interface {
	HasIndex(index string) bool
	HasChain(chain string) bool
	Chains() []msync.ChainInfo
	// Indexes tells the resource entry behind each index, for
	// X-Consul-LastContact.
	Indexes() []msync.IndexInfo
	Subscribe(ctx context.Context, t msync.Target) (*msync.Subscription, error)
	// Answers reads several targets from one state of the engine.
	Answers(ts ...msync.Target) []msync.Answer
	Stale() bool
	// Status tells since when a stale resource is cut off, for
	// X-Consul-LastContact.
	Status() []msync.ResourceStatus
	// StaleChanged is closed at a reload (among other changes): a
	// source a reload removed may be back.
	StaleChanged() <-chan struct{}
}

// Source is a chain or an index whose keys are services: Kind is
// "chains" or "indexes".
type Source struct {
	Kind, Name string
}

// String is the source as --consul-services names it: chains/NAME or
// indexes/NAME.
func (s Source) String() string { return s.Kind + "/" + s.Name }

// access is the non-resource URL whose "get" reading the source needs:
// that of its HTTP lookups.
func (s Source) access() string { return "/v1/" + s.Kind + "/" + url.PathEscape(s.Name) + "/*" }

// target is the engine's target of one service of the source.
func (s Source) target(service string) msync.Target {
	if s.Kind == "chains" {
		return msync.ChainOf(s.Name, service)
	}
	return msync.KeyOf(s.Name, service)
}

// ParseSources reads --consul-services: a comma-separated list of
// chains/NAME and indexes/NAME, each once.
func ParseSources(list string) ([]Source, error) {
	var out []Source
	seen := map[Source]bool{}
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		kind, name, ok := strings.Cut(item, "/")
		if !ok || kind != "chains" && kind != "indexes" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("%q: want chains/NAME or indexes/NAME", item)
		}
		src := Source{kind, name}
		if seen[src] {
			return nil, fmt.Errorf("%q given twice", item)
		}
		seen[src] = true
		out = append(out, src)
	}
	if len(out) == 0 {
		return nil, errors.New("no chain or index named: want chains/NAME[,indexes/NAME...]")
	}
	return out, nil
}

// Authorizer decides what a caller may read, as auth.TokenAuth.Check
// does for HTTP: whether the caller of r (its bearer token) is
// authenticated (thing "") or may get thing, the non-resource URL of a
// source's lookups (/v1/chains/CHAIN/* or /v1/indexes/INDEX/*). It
// answers the user's name and 0, or the HTTP status that refuses (401,
// 403, or 503 when it cannot tell now) and why.
type Authorizer func(r *http.Request, thing string) (user string, code int, msg string)

// Server is the Consul facade of one engine: an http.Handler.
type Server struct {
	engine  Engine
	log     *slog.Logger
	sources []Source
	node    string
	// base is added to the engine's sequence numbers to make the
	// X-Consul-Index of answers: the time the server started, in
	// microseconds, so that the indexes of a daemon started later are
	// higher than those of one before it (unless it made more than a
	// million commits a second of its life).
	base uint64
	high atomic.Uint64 // the highest index given out

	authorize Authorizer // nil: every caller reads every service
	limits    Limits
	gate      gate
	conns     *admission.Pool // nil: no connection limit
	watches   *watches
	metrics   *metrics
	mux       *http.ServeMux

	// closing ends the wait of every blocking query (the drain):
	// each answers what it has.
	closing context.Context
	close   context.CancelFunc
}

// New returns the facade of engine serving the services of sources,
// with DefaultLimits; its metrics are registered with reg.
func New(engine Engine, sources []Source, log *slog.Logger, reg prometheus.Registerer) *Server {
	node, _ := os.Hostname()
	if node == "" {
		node = "metasync"
	}
	s := &Server{engine: engine, log: log, sources: sources, node: node,
		base: uint64(time.Now().UnixMicro()), limits: DefaultLimits(), metrics: newMetrics()}
	s.closing, s.close = context.WithCancel(context.Background())
	s.watches = newWatches(s)
	s.gate.s = s
	s.mux = http.NewServeMux()
	s.routes()
	go s.watches.runSweeper(s.closing)
	if reg != nil {
		reg.MustRegister(s.metrics.collectors(s)...)
	}
	return s
}

// SetAuthorizer makes every request authenticate, and read only the
// services of the sources that a says it may; call it before the server
// serves.
func (s *Server) SetAuthorizer(a Authorizer) { s.authorize = a }

// Close answers every blocking query with what it holds now, at once,
// and makes those that come later answer without waiting: the drain.
// The engine's subscriptions end as their queries do.
func (s *Server) Close() {
	s.close()
	s.watches.stopAll()
}

// ServeHTTP implements http.Handler. A panic in a handler answers 500
// instead of dropping the connection.
//
// A request that announces a body, whatever its method or path, is
// answered at once (405 for a write, 400 for a read), before any route or token, and its connection
// closed and marked spent: net/http would otherwise wait, after the
// answer, for the announced body (up to ReadTimeout) to keep the
// connection alive, and a connection that waits for its request's body
// is busy, which the limiter never closes to make room. A caller that
// needs no credential could hold every connection so.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		w.Header().Set("Connection", "close")
		s.spent(r)
		code, msg := http.StatusBadRequest, "a request to metasync's Consul API carries no body: the API is read-only"
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			code, msg = http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed: metasync's Consul API is read-only", r.Method)
			w.Header().Set("Allow", "GET, HEAD")
		}
		s.metrics.requests.WithLabelValues(endpointOf(r), strconv.Itoa(code)).Inc()
		writeText(w, code, msg)
		return
	}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("Consul facade: handler panic", "path", r.URL.Path, "panic", fmt.Sprint(v))
			writeText(w, http.StatusInternalServerError, "internal error")
		}
	}()
	s.mux.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w)}, r)
}

// answerWriteTimeout is how long an answer may take to be written, from
// its first byte: a caller that does not read its answer holds its
// connection that long, not the server's WriteTimeout (which a blocking
// query's wait needs).
var answerWriteTimeout = 10 * time.Second

// deadlineWriter sets the connection's write deadline to
// answerWriteTimeout from the first byte (or status) written.
type deadlineWriter struct {
	http.ResponseWriter
	rc  *http.ResponseController
	set bool
}

func (d *deadlineWriter) start() {
	if !d.set {
		d.set = true
		_ = d.rc.SetWriteDeadline(time.Now().Add(answerWriteTimeout))
	}
}

func (d *deadlineWriter) WriteHeader(code int) {
	d.start()
	d.ResponseWriter.WriteHeader(code)
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	d.start()
	return d.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController the writer under it.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// HTTPServer returns an http.Server for the facade, with timeouts fit
// for blocking queries (a write may wait MaxWait and its jitter) and for
// untrusted callers; it serves over TLS when tlsConfig is not nil. Its
// Shutdown answers the blocking queries at once (Close). Serve it on
// Listener: it tells the limiter which connections are idle. An idle
// connection is closed after 30 s: a Consul client sends its next
// blocking query as soon as it has an answer, so a connection idle that
// long serves no loop.
func (s *Server) HTTPServer(tlsConfig *tls.Config, errorLog *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           s,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      MaxWait + MaxWait/16 + 30*time.Second,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(errorLog.Handler(), slog.LevelDebug),

		DisableGeneralOptionsHandler: true,

		ConnState:   s.connState,
		ConnContext: connContext,
	}
	srv.RegisterOnShutdown(s.Close)
	return srv
}

// IdleTimeout is how long a connection kept alive between requests
// stays open.
const IdleTimeout = 30 * time.Second

// writeText answers code with a text body, as Consul answers its errors.
func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, msg)
}
