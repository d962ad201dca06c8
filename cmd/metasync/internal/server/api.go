// Package server is the HTTP API of `metasync serve`: index and chain lookups,
// health (/livez, /readyz) and Prometheus metrics, over an engine.
package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/internal/admission"
	"github.com/iidp/metasync/internal/wire"
	msync "github.com/iidp/metasync/sync"
)

// MaxKeys is the largest page of GET /v1/indexes/{index}/keys.
const MaxKeys = 10000

// Engine is what the API reads: the Reader of every face, and what the
// daemon's answers and metrics add to it (synced and stale with each
// answer, the resources' status, the subscriptions' counts).
// *msync.Engine is one.
type Engine interface {
	msync.Reader
	Answer(t msync.Target) msync.Answer
	Answers(ts ...msync.Target) []msync.Answer
	AnswerIndexFields(index, key string) (msync.FieldsAnswer, error)
	AnswerResourceFields(resource, objectKey string) (msync.FieldsAnswer, error)
	HasIndex(index string) bool
	HasChain(chain string) bool
	IndexSynced(index string) bool
	Stale() bool
	StaleChanged() <-chan struct{}
	Status() []msync.ResourceStatus
	SnapshotStatus() msync.SnapshotStatus
	Subscriptions() msync.SubscriptionStats
	Conflicts() []msync.Conflict
	Clusters() []msync.ClusterStatus
	ClusterStates(t msync.Target) map[string]msync.ClusterState
	ClusterNames() []string
}

var _ Engine = (*msync.Inspector)(nil)

// Server serves the HTTP API of one engine.
type Server struct {
	engine   Engine
	sdCache  sdCache
	log      *slog.Logger
	mux      *http.ServeMux
	registry *prometheus.Registry
	lookups  *prometheus.CounterVec
	stopping atomic.Bool

	heartbeat     time.Duration
	streams       context.Context // ends when the server drains
	endStreams    context.CancelFunc
	streamMetrics *streamMetrics
	openStreams   gosync.Map    // *http.ResponseController of each open stream
	explains      *rate.Limiter // of ?explain=true answers (ExplainRate)
	explainMu     gosync.Mutex
	explainBy     map[string]*rate.Limiter // per caller (ExplainRatePerCaller)

	// Limits on streams and connections (see limits.go).
	limitsMu     gosync.Mutex
	limits       Limits
	conns        *connLimiter // nil without a connection limit
	streamGate   admission.Gate
	limitMetrics *limitMetrics
}

// New builds the API over an engine.
func New(e Engine, log *slog.Logger) *Server {
	s := &Server{engine: e, log: log, mux: http.NewServeMux(), registry: prometheus.NewRegistry(),
		heartbeat: DefaultHeartbeat, streamMetrics: newStreamMetrics(),
		explains: rate.NewLimiter(ExplainRate, ExplainBurst)}
	s.limitMetrics = newLimitMetrics(s)
	s.streams, s.endStreams = context.WithCancel(context.Background())
	s.lookups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "metasync_lookups_total",
		Help: "Lookups served over HTTP, by kind (index, chain, keys, sd), name (of the index or chain; empty for an unknown one) and result (hit, miss, unsynced, unknown).",
	}, []string{"kind", "name", "result"})
	s.registry.MustRegister(s.limitMetrics.collectors()...)
	s.registry.MustRegister(
		s.lookups,
		s.streamMetrics.open,
		s.streamMetrics.frames,
		newEngineCollector(e),
		// The default Go metrics and the live heap (go_gc_heap_live_bytes):
		// what resident memory comes to when no garbage is kept.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	s.mux.HandleFunc("/v1/indexes", s.get(noCluster(s.listIndexes)))
	s.mux.HandleFunc("/v1/indexes/{index}/keys", s.get(noCluster(s.listKeys)))
	s.mux.HandleFunc("/v1/indexes/{index}/keys/{key...}", s.get(s.lookup))
	s.mux.HandleFunc("/v1/indexes/{index}/keys/{key}/objects", s.get(noCluster(s.indexObjects)))
	s.mux.HandleFunc("/v1/chains", s.get(noCluster(s.listChains)))
	s.mux.HandleFunc("/v1/chains/{chain}/keys", s.get(noCluster(s.chainKeys)))
	s.mux.HandleFunc("/v1/chains/{chain}/keys/{key...}", s.get(s.resolve))
	s.mux.HandleFunc("/v1/resources/{resource}/objects/{key...}", s.get(s.object))
	s.mux.HandleFunc("/v1/sd/chains/{chain}", s.get(s.sdChain))
	s.mux.HandleFunc("/v1/sd/indexes/{index}", s.get(s.sdIndex))
	s.mux.HandleFunc("/v1/clusters", s.get(noCluster(s.clusters)))
	s.mux.HandleFunc("/livez", s.get(s.livez))
	s.mux.HandleFunc("/readyz", s.get(s.readyz))
	s.mux.Handle("/metrics", s.get(promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}).ServeHTTP))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s", r.URL.Path))
	})
	return s
}

// ServeHTTP implements http.Handler. A panic in a handler answers 500
// instead of dropping the connection.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("handler panic", "path", r.URL.Path, "panic", fmt.Sprint(v))
			writeError(w, http.StatusInternalServerError, "internal error")
		}
	}()
	s.mux.ServeHTTP(w, r)
}

// MustRegister adds collectors to the server's /metrics.
func (s *Server) MustRegister(cs ...prometheus.Collector) { s.registry.MustRegister(cs...) }

// Handle serves GET (and HEAD) of pattern with h, beside the API: a page
// of another face of the daemon (the xDS clients' status). Behind
// TokenAuth, it asks access to its own path.
func (s *Server) Handle(pattern string, h http.HandlerFunc) { s.mux.HandleFunc(pattern, s.get(h)) }

// Registerer is the registry of /metrics, for other faces of the daemon.
func (s *Server) Registerer() prometheus.Registerer { return s.registry }

// SetStopping makes /readyz fail from now on: the process is shutting down.
func (s *Server) SetStopping() { s.stopping.Store(true) }

// serverErrorLog is net/http's log of what it refuses before any handler
// (a TLS handshake that fails, a request it cannot parse): anyone who can
// connect writes to it, so it keeps the first 10 lines and then at most
// one every 10 s.
func serverErrorLog(l *slog.Logger) *log.Logger {
	inner := slog.NewLogLogger(l.Handler(), slog.LevelWarn)
	some := &rate.Sometimes{First: 10, Interval: 10 * time.Second}
	return log.New(writerFunc(func(p []byte) (int, error) {
		some.Do(func() {
			inner.Print(strings.TrimSuffix(string(p), "\n") + " (such lines: the first 10, then one every 10 s)")
		})
		return len(p), nil
	}), "", 0)
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// connKey keys the connection of a request in its context (see
// HTTPServer's ConnContext).
type connKey struct{}

// noBody answers 400, and closes the connection, for a request that
// announces a body: the API reads none. Answered at once, before any
// review, such a request never holds a connection: net/http would
// otherwise wait, after the answer, for the announced body (up to
// ReadTimeout) to keep the connection alive, and a connection that waits
// for its request's body is active, which the connection limit never
// evicts. A client that needs no credential could hold every connection
// so, and fail the probes. The connection is the limit's first to evict
// until it closes.
func (s *Server) noBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			if l := s.connLimiter(); l != nil {
				if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
					l.Spent(c)
				}
			}
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusBadRequest, "a request to metasync carries no body")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// get allows GET and HEAD only, answering 405 with a JSON error otherwise.
// noCluster refuses ?cluster= on a route that does not narrow by it: a
// caller who asked for one cluster's part must not get every cluster's
// thinking it is one's.
func noCluster(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, given := r.URL.Query()["cluster"]; given {
			writeError(w, http.StatusBadRequest, "cluster= narrows lookups, chain lookups, their streams and /v1/sd answers, and picks an object's cluster in /v1/resources/{resource}/objects/{key}: leave it out here")
			return
		}
		h(w, r)
	}
}

func (s *Server) get(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed; use GET", r.Method))
			return
		}
		h(w, r)
	}
}

func (s *Server) listIndexes(w http.ResponseWriter, _ *http.Request) {
	ans := wire.Indexes{Indexes: []wire.Index{}, Stale: s.engine.Stale()}
	for _, ix := range s.engine.Indexes() {
		wi := wire.Index{Name: ix.Name, Resource: ix.Resource, Keys: ix.Keys, Synced: ix.Synced, Stale: ix.Stale, Failing: ix.Failing, Unique: ix.Unique, Conflicts: ix.Conflicts}
		if rf := ix.LastRuleError; rf != nil {
			wi.LastRuleError = &wire.RuleFailure{Object: rf.Object, Cluster: rf.Cluster, Error: rf.Error, At: rf.At}
		}
		ans.Indexes = append(ans.Indexes, wi)
	}
	writeJSON(w, http.StatusOK, ans)
}

// continueToken returns the continue token of a page that ends with key.
// The token is never empty, also for the empty key: an empty continue
// would read as "from the start".
func continueToken(key string) string {
	return "k" + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// afterKey returns the key that a continue token names.
func afterKey(token string) (string, error) {
	enc, ok := strings.CutPrefix(token, "k")
	if !ok {
		return "", errors.New("not a continue token")
	}
	key, err := base64.RawURLEncoding.DecodeString(enc)
	return string(key), err
}

// listKeys answers the sorted keys of an index, at most ?limit= of them
// (default and maximum MaxKeys), after the page that ?continue= ends. The
// keys are sorted once per state of the index and shared, so that a page
// costs about its size.
func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	index := r.PathValue("index")
	if !s.engine.HasIndex(index) {
		s.unknownIndex(w, "keys", index)
		return
	}
	if q := r.URL.Query(); q.Has("zone") || q.Has("node") {
		writeError(w, http.StatusBadRequest, "zone and node narrow the answer of a key (/v1/indexes/INDEX/keys/KEY or a chain's), not the keys of an index")
		return
	}
	if watching(r) {
		s.stream(w, r, msync.IndexOf(index))
		return
	}
	limit := MaxKeys
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit=%q: want a positive integer", v))
			return
		}
		limit = min(n, MaxKeys)
	}
	ans := s.engine.Answer(msync.IndexOf(index))
	keys := ans.Values
	if token := r.URL.Query().Get("continue"); token != "" {
		after, err := afterKey(token)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("continue=%q: not a token of this API; pass back the continue of the previous page", token))
			return
		}
		keys = keys[sort.SearchStrings(keys, after):]
		if len(keys) > 0 && keys[0] == after {
			keys = keys[1:]
		}
	}
	page := wire.Keys{Index: index, Synced: notSynced(ans.Synced), Stale: ans.Stale}
	if len(keys) > limit {
		keys = keys[:limit]
		page.Continue = continueToken(keys[limit-1])
	}
	keys = nonNil(keys)
	page.Keys = &keys
	s.lookups.WithLabelValues("keys", index, "hit").Inc()
	writeJSON(w, http.StatusOK, page)
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) {
	index, key := r.PathValue("index"), r.PathValue("key")
	if objectsOf, ok := objectsKey(r); ok {
		// ServeMux routes .../keys/%2F/objects here, with key "//objects"
		// (every other key reaches indexObjects): the objects of key "/".
		r.SetPathValue("key", objectsOf)
		s.indexObjects(w, r)
		return
	}
	if !s.engine.HasIndex(index) {
		s.unknownIndex(w, "index", index)
		return
	}
	s.answer(w, r, msync.KeyOf(index, key))
}

// answer answers a lookup of t, a key of an index or of a chain that
// exists: once, explained (explain=true), or as a stream (watch=true),
// narrowed to a zone or node and to a cluster as the query asks.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, t msync.Target) {
	if !validKey(w, t.Key) {
		return
	}
	at, ok := locality(w, r)
	if !ok {
		return
	}
	t.At = at
	explain, ok := s.explaining(w, r)
	if !ok {
		return
	}
	if s.inCluster(w, r, &t, explain) {
		return
	}
	if watching(r) {
		if explain {
			writeError(w, http.StatusBadRequest, "explain=true and watch=true: explain answers once; drop one of them")
			return
		}
		s.stream(w, r, t)
		return
	}
	var ans msync.Answer
	var steps []wire.Step
	if explain {
		if t.Chain != "" && !s.mayExplainChain(w, r, t.Chain) {
			return
		}
		if !s.explainBudget(w, r) {
			return
		}
		x := s.engine.Explain(t)
		ans, steps = x.Answer, wireSteps(x.Steps)
	} else {
		ans = s.engine.Answer(t)
	}
	values := nonNil(ans.Values)
	out := wire.Lookup{Index: t.Index, Chain: t.Chain, Key: t.Key, Values: &values, Synced: notSynced(ans.Synced), Stale: ans.Stale, Clusters: wireClusters(ans.Clusters), Steps: steps}
	if t.Chain != "" {
		s.count("chain", t.Chain, ans.Values)
	} else {
		s.count("index", t.Index, ans.Values)
	}
	writeJSON(w, http.StatusOK, out)
}

// mayExplainChain reports whether the caller may have chain explained:
// the steps show each index's keys, values and objects, so a caller must
// be allowed to read each index, not only the chain. It answers the
// refusal.
func (s *Server) mayExplainChain(w http.ResponseWriter, r *http.Request, chain string) bool {
	for _, ch := range s.engine.Chains() {
		if ch.Name != chain {
			continue
		}
		for _, ix := range ch.Indexes {
			if code, msg := mayGet(r, "/v1/indexes/"+ix+"/*"); code != 0 {
				if code == http.StatusServiceUnavailable {
					w.Header().Set("Retry-After", "1")
				}
				writeError(w, code, fmt.Sprintf("explain of chain %q shows its steps: it needs get on /v1/indexes/%s/* too: %s", chain, ix, msg))
				return false
			}
		}
	}
	return true
}

// objectsKey returns the key of a request for the objects behind a key
// (/v1/indexes/{index}/keys/{key}/objects, the key one escaped segment),
// read from the escaped path.
func objectsKey(r *http.Request) (string, bool) {
	p := r.URL.EscapedPath()
	_, rest, ok := strings.Cut(strings.TrimPrefix(p, "/v1/indexes/"), "/keys/")
	if !ok || !strings.HasPrefix(p, "/v1/indexes/") {
		return "", false
	}
	seg, ok := strings.CutSuffix(rest, "/objects")
	if !ok || seg == "" || strings.Contains(seg, "/") {
		return "", false
	}
	key, err := url.PathUnescape(seg)
	return key, err == nil
}

// notSynced returns a pointer to false when synced is false, else nil: an
// answer says "synced": false while its resource has never completed a
// list (an empty answer then means "not known yet", not "no values"), and
// is the pinned answer otherwise.
func notSynced(synced bool) *bool {
	if synced {
		return nil
	}
	return &synced
}

func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	chain, key := r.PathValue("chain"), r.PathValue("key")
	if !s.engine.HasChain(chain) {
		s.lookups.WithLabelValues("chain", "", "unknown").Inc()
		s.unknownChain(w, chain)
		return
	}
	s.answer(w, r, msync.ChainOf(chain, key))
}

func (s *Server) count(kind, name string, values []string) {
	result := "hit"
	if len(values) == 0 {
		result = "miss"
	}
	s.lookups.WithLabelValues(kind, name, result).Inc()
}

func (s *Server) livez(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is 200 once every resource is ready, else 503. Its short form
// names the resources that are not ready with a generic word ("not
// synced", "not ready"): it is open to anyone who can reach the port, and
// the reasons name the apiserver, namespaces, selectors and RBAC errors.
// ?verbose gives the reasons and lists every resource with its state;
// behind TokenAuth, only to a caller allowed to get /readyz/verbose
// (others get the short form, with the same status code, and "verbose"
// saying why). A resource that a config reload added counts once its
// first list is done ("syncing" until then).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	_, verbose := r.URL.Query()["verbose"]
	ready := !s.stopping.Load()
	var resources []wire.ResourceHealth
	var reasons []string
	if !ready {
		reasons = append(reasons, "shutting down")
	}
	for _, st := range s.engine.Status() {
		rh := wire.ResourceHealth{Name: st.Name, Cluster: st.Cluster, Optional: st.Optional, Ready: st.Ready, Synced: st.Synced, Objects: st.Objects, Reason: st.Reason, Syncing: st.Syncing, Stale: st.Stale}
		if verbose {
			for _, index := range slices.Sorted(maps.Keys(st.RuleErrors)) {
				ih := wire.IndexHealth{Name: index, Failing: st.Failing[index]}
				if rf, ok := st.LastRuleError[index]; ok {
					ih.LastRuleError = &wire.RuleFailure{Object: rf.Object, Cluster: rf.Cluster, Error: rf.Error, At: rf.At}
				}
				rh.Indexes = append(rh.Indexes, ih)
			}
		}
		resources = append(resources, rh)
		if st.Ready || st.Syncing && !st.Synced || st.Optional {
			// A resource a reload added counts once it has listed; one of
			// a cluster not required, never.
			continue
		}
		ready = false
		name := st.Name
		if st.Cluster != "" {
			name += " in cluster " + st.Cluster
		}
		switch {
		case verbose:
			reasons = append(reasons, name+": "+st.Reason)
		case !st.Synced:
			reasons = append(reasons, name+": not synced")
		case st.Stale && st.Error != "":
			reasons = append(reasons, name+": stale, cut off from its apiserver")
		case st.Stale:
			reasons = append(reasons, name+": stale, answering from a snapshot")
		default:
			reasons = append(reasons, name+": not ready")
		}
	}
	ans := map[string]any{"status": "ok"}
	code := http.StatusOK
	if !ready {
		ans["status"] = "not ready"
		ans["reasons"] = reasons
		code = http.StatusServiceUnavailable
	}
	if verbose {
		ans["resources"] = resources
		if c := s.engine.Conflicts(); len(c) > 0 {
			ans["conflicts"] = conflictsHealth(c)
		}
	}
	if note := auth.WithheldFrom(r.Context()); note != "" {
		ans["verbose"] = note
	}
	writeJSON(w, code, ans)
}

// maxConflictKeys is how many keys in conflict /readyz?verbose names per
// index; "count" gives them all.
const maxConflictKeys = 100

// conflictsHealth lists the keys in conflict of unique indexes: they are
// answered (the oldest claimant's values), so they do not make /readyz
// fail, but someone should look.
func conflictsHealth(cs []msync.Conflict) []wire.ConflictHealth {
	out := make([]wire.ConflictHealth, 0, len(cs))
	for _, c := range cs {
		out = append(out, wire.ConflictHealth{Index: c.Index, Count: len(c.Keys), Keys: c.Keys[:min(len(c.Keys), maxConflictKeys)]})
	}
	return out
}

func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// mayGet asks whether r's caller may get thing too (see auth.Caller): 0
// when it may, or without the guard.
func mayGet(r *http.Request, thing string) (code int, msg string) {
	if c, ok := auth.CallerFrom(r.Context()); ok && c.MayGet != nil {
		return c.MayGet(thing)
	}
	return 0, ""
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, wire.Error{Error: msg})
}

// HTTPServer returns an http.Server for the API with timeouts and limits
// fit for a daemon next to untrusted callers, behind auth when not nil.
func (s *Server) HTTPServer(addr string, errorLog *slog.Logger, guard *auth.TokenAuth) *http.Server {
	var h http.Handler = s
	if guard != nil {
		h = guard.Wrap(s)
		// Its review counters; a second HTTPServer over the same guard
		// finds them registered already.
		_ = s.registry.Register(guard)
	}
	srv := &http.Server{
		Addr:              addr,
		Handler:           s.noBody(h),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          serverErrorLog(errorLog),
		// net/http answers "OPTIONS *" itself, before the handler: it
		// would wait for an announced body as above, out of noBody's
		// reach. Without its own handler the request is the API's.
		DisableGeneralOptionsHandler: true,
	}
	// A change stream outlives WriteTimeout (it sets its own deadline per
	// frame) and ends when Shutdown begins.
	srv.RegisterOnShutdown(s.CloseStreams)
	// The limited listener (see Listener) closes idle connections to make
	// room: the server says which are.
	if l := s.connLimiter(); l != nil {
		srv.ConnState = l.ConnState
		srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) }
	}
	return srv
}
