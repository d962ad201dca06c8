package consul

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	msync "github.com/iidp/metasync/sync"
)

// DefaultWait and MaxWait are the wait of a blocking query without
// ?wait=, and the longest one: a longer wait is cut to it, as Consul
// does. Each wait gets up to a sixteenth more, at random, as Consul's
// do, so that the queries of many clients started together spread.
const (
	DefaultWait = 5 * time.Minute
	MaxWait     = 10 * time.Minute
)

// The endpoints, as the metrics name them.
const (
	endpointAgentSelf       = "agent_self"
	endpointCatalogServices = "catalog_services"
	endpointCatalogService  = "catalog_service"
	endpointHealthService   = "health_service"
	endpointOther           = "other"
)

func (s *Server) routes() {
	s.mux.HandleFunc("/v1/agent/self", s.get(endpointAgentSelf, s.agentSelf))
	s.mux.HandleFunc("/v1/catalog/services", s.get(endpointCatalogServices, func(w http.ResponseWriter, r *http.Request) {
		s.blocking(w, r, endpointCatalogServices, watchKey{catalog: true})
	}))
	s.mux.HandleFunc("/v1/catalog/service/{name...}", s.get(endpointCatalogService, func(w http.ResponseWriter, r *http.Request) {
		s.blocking(w, r, endpointCatalogService, watchKey{service: r.PathValue("name")})
	}))
	s.mux.HandleFunc("/v1/health/service/{name...}", s.get(endpointHealthService, func(w http.ResponseWriter, r *http.Request) {
		s.blocking(w, r, endpointHealthService, watchKey{service: r.PathValue("name")})
	}))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		code := http.StatusNotFound
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			code = http.StatusMethodNotAllowed
			w.Header().Set("Allow", "GET, HEAD")
		}
		s.metrics.requests.WithLabelValues(endpointOther, strconv.Itoa(code)).Inc()
		writeText(w, code, fmt.Sprintf("metasync serves the read side of Consul's catalog and health API only (agent/self, catalog/services, catalog/service, health/service): not %s %s", r.Method, clip(r.URL.Path)))
	})
}

// get allows GET and HEAD only (405 otherwise: the facade is
// read-only; a request with a body never gets here, see ServeHTTP),
// counts the request by endpoint and status, and authenticates the
// caller when the server has an Authorizer.
func (s *Server) get(endpoint string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		defer func() { s.metrics.requests.WithLabelValues(endpoint, strconv.Itoa(rec.code)).Inc() }()
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			rec.Header().Set("Allow", "GET, HEAD")
			writeText(rec, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed: metasync's Consul API is read-only", r.Method))
			return
		}
		if dc := r.URL.Query().Get("dc"); dc != "" && dc != Datacenter {
			writeText(rec, http.StatusInternalServerError, fmt.Sprintf("No path to datacenter %q: metasync is datacenter %q", dc, Datacenter))
			return
		}
		if r.URL.Query().Has("filter") {
			writeText(rec, http.StatusBadRequest, "filter is not supported by metasync's Consul API")
			return
		}
		h(rec, r)
	}
}

// statusRecorder keeps the status a handler wrote, for the metrics.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

// withToken is r with its Consul token (X-Consul-Token) as the bearer
// token that the Authorizer reads, unless it has an Authorization header.
func withToken(r *http.Request) *http.Request {
	tok := r.Header.Get("X-Consul-Token")
	if tok == "" || r.Header.Get("Authorization") != "" {
		return r
	}
	r2 := r.Clone(r.Context())
	r2.Header.Set("Authorization", "Bearer "+tok)
	return r2
}

// refuse answers an Authorizer's refusal. A 401 or 403 closes the
// connection, the first to be closed to make room until it is: a caller
// without a token that may read cannot keep connections alive.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, msg string) {
	switch code {
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	case http.StatusForbidden:
		msg = "Permission denied: " + msg
		fallthrough
	case http.StatusUnauthorized:
		w.Header().Set("Connection", "close")
		s.spent(r)
	}
	writeText(w, code, msg)
}

// readable returns which sources r's caller may read (all without an
// Authorizer), and its user name; code is not 0 when the caller is
// refused, or may read none.
func (s *Server) readable(r *http.Request) (may []bool, user string, code int, msg string) {
	may = make([]bool, len(s.sources))
	if s.authorize == nil {
		for i := range may {
			may[i] = true
		}
		return may, "", 0, ""
	}
	r = withToken(r)
	user, code, msg = s.authorize(r, "")
	if code != 0 {
		return nil, "", code, msg
	}
	code, msg = http.StatusForbidden, ""
	for i, src := range s.sources {
		_, c, m := s.authorize(r, src.access())
		switch {
		case c == 0:
			may[i], code, msg = true, 0, ""
		case code != 0 && (c == http.StatusUnauthorized || c == http.StatusServiceUnavailable || msg == ""):
			code, msg = c, m
		}
	}
	return may, user, code, msg
}

// agentSelf answers GET /v1/agent/self: the datacenter and this node,
// which clients such as Prometheus' consul_sd read first.
func (s *Server) agentSelf(w http.ResponseWriter, r *http.Request) {
	if s.authorize != nil {
		if _, code, msg := s.authorize(withToken(r), ""); code != 0 {
			s.refuse(w, r, code, msg)
			return
		}
	}
	writeJSON(w, map[string]any{
		"Config": map[string]any{"Datacenter": Datacenter, "NodeName": s.node, "NodeID": "", "Server": false,
			"Revision": "", "Version": "metasync"},
		"Member": map[string]any{"Name": s.node, "Addr": "", "Port": 0, "Tags": map[string]string{"dc": Datacenter, "role": "node"},
			"Status": 1, "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2, "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4},
		"Meta":  map[string]string{},
		"Stats": map[string]any{},
	})
}

// queryParams are a blocking query's ?index and ?wait.
type queryParams struct {
	index uint64 // 0: answer at once
	wait  time.Duration
}

// parseQuery reads ?index and ?wait as Consul does: an index is an
// unsigned integer, a wait a duration ("10s", "5m"; a number alone is
// seconds), cut to MaxWait.
func parseQuery(r *http.Request) (queryParams, string) {
	q := r.URL.Query()
	p := queryParams{wait: DefaultWait}
	if v := q.Get("index"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return p, fmt.Sprintf("Invalid index %q: want an unsigned integer", v)
		}
		p.index = n
	}
	if v := q.Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			n, nerr := strconv.ParseUint(v, 10, 32)
			if nerr != nil {
				return p, fmt.Sprintf("Invalid wait time %q: want a duration such as 30s or 5m", v)
			}
			d = time.Duration(n) * time.Second
		}
		if d < 0 {
			return p, fmt.Sprintf("Invalid wait time %q: negative", v)
		}
		p.wait = min(d, MaxWait)
	}
	return p, ""
}

// MaxServiceName is the longest service name read, in bytes: a longer
// one is 400 (a key of an index is seldom a tenth of it).
const MaxServiceName = 512

// blocking answers a read of k (endpoint), at once without ?index, with
// an index that the answer has passed, with one this daemon never gave
// or with ?wait=0; else when the answer's index passes the index, or the
// wait is over (the same answer, with the index the client sent: never
// lower than one it holds). Every name is followed by its own watch, a
// name that is no key of the sources too: its query wakes when that key
// appears, and no other key's change costs it anything.
func (s *Server) blocking(w http.ResponseWriter, r *http.Request, endpoint string, k watchKey) {
	p, bad := parseQuery(r)
	if bad != "" {
		writeText(w, http.StatusBadRequest, bad)
		return
	}
	if !k.catalog && k.service == "" {
		writeText(w, http.StatusBadRequest, "Missing service name")
		return
	}
	if len(k.service) > MaxServiceName {
		writeText(w, http.StatusBadRequest, fmt.Sprintf("Invalid service name: %d bytes, at most %d", len(k.service), MaxServiceName))
		return
	}
	may, user, code, msg := s.readable(r)
	if code != 0 {
		s.refuse(w, r, code, msg)
		return
	}
	now := s.now()
	if p.index == 0 || p.index > now || p.wait == 0 || s.closing.Err() != nil {
		// No index, or no wait; or an index this daemon never gave (a
		// daemon's before a restart, or another replica's, or made up):
		// waiting would keep what the client holds, of another state,
		// for the whole wait. The client, seeing a lower index, starts
		// again from this one.
		st, idx := s.fresh(k)
		if p.index <= now {
			idx = max(idx, p.index)
		}
		s.answer(w, r, endpoint, k, st, idx, may, st.stales)
		return
	}
	caller := callerOf(r, user)
	release, reason, why := s.gate.admit(caller)
	if reason != "" {
		s.refused(reason, why)
		w.Header().Set("Retry-After", "5")
		code := http.StatusTooManyRequests
		if reason == refusedBlocking {
			code = http.StatusServiceUnavailable
		}
		writeText(w, code, why)
		return
	}
	defer release()
	s.metrics.open.Inc()
	defer s.metrics.open.Dec()
	wait := p.wait + rand.N(p.wait/16+1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	staleNow := func() bool { return s.staleNow(k).staleFor(may) }
	q := &query{s: s, r: r, timer: timer.C, staleNow: staleNow, wasStale: staleNow(), staleCh: s.engine.StaleChanged()}
	wt := s.watches.acquire(k)
	defer s.watches.release(wt, caller)
	result := "changed"
	for {
		st := wt.current()
		if st.index > p.index || !st.synced {
			break
		}
		if result = q.wait(st.changed); result != "" {
			break
		}
		result = "changed"
	}
	q.done(result)
	if result == "gone" {
		return
	}
	st, idx := wt.answered(p.index)
	// The watch reads again at a change of its sources only: the
	// answer's staleness is read now.
	s.answer(w, r, endpoint, k, st, idx, may, s.staleNow(k).stales)
}

// query is a blocking query's wait.
type query struct {
	s     *Server
	r     *http.Request
	timer <-chan time.Time
	// staleNow reads whether the query's answer is stale now; wasStale is
	// what it read when the query began.
	staleNow func() bool
	wasStale bool
	staleCh  <-chan struct{}
}

// wait waits for changed, and answers "" when it is closed; else why the
// wait is over: timeout, drain, gone (the client went) or stale (the
// answer became stale, or caught up: X-Consul-KnownLeader changed).
func (q *query) wait(changed <-chan struct{}) string {
	for {
		select {
		case <-changed:
			return ""
		case <-q.timer:
			return "timeout"
		case <-q.s.closing.Done():
			return "drain"
		case <-q.r.Context().Done():
			return "gone"
		case <-q.staleCh:
			q.staleCh = q.s.engine.StaleChanged()
			if q.staleNow() != q.wasStale {
				return "stale"
			}
		}
	}
}

// done counts the query's end.
func (q *query) done(result string) { q.s.metrics.answers.WithLabelValues(result).Inc() }

// fresh reads k from the engine's state now, and the index to answer
// it with: never below one that k's watch gave.
func (s *Server) fresh(k watchKey) (*state, uint64) {
	st := s.read(k, nil)
	return st, max(st.index, s.watches.highest(k))
}

// answer writes st, the state of k, as endpoint answers it, with what
// the caller may read (may, by source) and Consul's headers, index its
// X-Consul-Index (at least st's), stales whether each source's answer is
// stale now (X-Consul-KnownLeader, X-Consul-LastContact, of the sources
// the caller may read). Before the sources behind it have synced it
// answers 503: no answer is known yet.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, endpoint string, k watchKey, st *state, index uint64, may []bool, stales []bool) {
	if !st.synced {
		w.Header().Set("Retry-After", "1")
		writeText(w, http.StatusServiceUnavailable, "metasync has not completed its first list of the chains or indexes behind this answer yet: nothing is known yet")
		return
	}
	h := w.Header()
	h.Set("X-Consul-Index", strconv.FormatUint(index, 10))
	contact, stale := s.lastContact(stales, may)
	h.Set("X-Consul-KnownLeader", strconv.FormatBool(!stale))
	h.Set("X-Consul-LastContact", strconv.FormatInt(contact.Milliseconds(), 10))
	h.Set("X-Consul-Effective-Consistency", "leader")
	if k.catalog {
		out := map[string][]string{}
		for i, names := range st.names {
			if may[i] {
				for _, n := range names {
					if !servable(n) {
						continue
					}
					out[n] = []string{}
				}
			}
		}
		writeJSON(w, out)
		return
	}
	var ins []instance
	for i, part := range st.parts {
		if may[i] {
			ins = append(ins, part...)
		}
	}
	if len(st.parts) > 1 {
		slices.SortStableFunc(ins, compareInstances)
		ins = slices.CompactFunc(ins, func(a, b instance) bool { return a.host == b.host && a.port == b.port })
	}
	if tag := r.URL.Query().Get("tag"); tag != "" {
		ins = nil // metasync's instances have no tags
	}
	if endpoint == endpointHealthService {
		out := make([]serviceEntry, 0, len(ins))
		for _, in := range ins {
			out = append(out, in.health(k.service, st.index))
		}
		writeJSON(w, out)
		return
	}
	out := make([]catalogService, 0, len(ins))
	for _, in := range ins {
		out = append(out, in.catalog(k.service, st.index))
	}
	writeJSON(w, out)
}

// now is the highest index this server has given or can give now: no
// legitimate client holds a higher one.
func (s *Server) now() uint64 {
	cur := s.base + s.engine.Answers(msync.Target{})[0].Seq
	return max(cur, s.high.Load())
}

// seen records an index given out.
func (s *Server) seen(index uint64) {
	for {
		h := s.high.Load()
		if index <= h || s.high.CompareAndSwap(h, index) {
			return
		}
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// endpointOf is the endpoint that routes would give r, for its metrics.
func endpointOf(r *http.Request) string {
	switch p := r.URL.Path; {
	case p == "/v1/agent/self":
		return endpointAgentSelf
	case p == "/v1/catalog/services":
		return endpointCatalogServices
	case strings.HasPrefix(p, "/v1/catalog/service/"):
		return endpointCatalogService
	case strings.HasPrefix(p, "/v1/health/service/"):
		return endpointHealthService
	}
	return endpointOther
}

// staleNow is the staleness of k's answer now: a read of its sources
// when some resource of the daemon is stale, else none.
func (s *Server) staleNow(k watchKey) *state {
	if !s.engine.Stale() {
		return &state{stales: make([]bool, len(s.sources))}
	}
	return s.read(k, nil)
}

// lastContact tells whether an answer is stale (X-Consul-KnownLeader
// false): of the sources the caller may read (may), whether one's answer
// is (stales); and X-Consul-LastContact: 0 for an answer that is not
// stale; for one that is, how long the longest-failing stale resource
// behind those sources has been cut off from its apiserver (0 when none
// says since when: data from a snapshot, not caught up yet).
func (s *Server) lastContact(stales, may []bool) (time.Duration, bool) {
	stale := false
	behind := map[string]bool{} // resource entries behind the stale sources
	for i, src := range s.sources {
		if !stales[i] || !may[i] {
			continue
		}
		stale = true
		indexes := []string{src.Name}
		if src.Kind == "chains" {
			indexes = nil
			for _, ch := range s.engine.Chains() {
				if ch.Name == src.Name {
					indexes = ch.Indexes
				}
			}
		}
		for _, ix := range s.engine.Indexes() {
			if slices.Contains(indexes, ix.Name) {
				behind[ix.Resource] = true
			}
		}
	}
	if !stale {
		return 0, false
	}
	var longest time.Duration
	for _, st := range s.engine.Status() {
		if st.Stale && behind[st.Name] && !st.ErrorSince.IsZero() {
			longest = max(longest, time.Since(st.ErrorSince))
		}
	}
	return longest, true
}

// clip is s cut to 200 bytes, for an answer that repeats what a caller
// sent: a long path is not sent back whole.
func clip(s string) string {
	if len(s) <= 200 {
		return s
	}
	return s[:200] + "..."
}

// servable reports whether a key can be asked for as a service: a name a
// path can carry (not empty, not . or .., which a path cleans away) of at
// most MaxServiceName bytes. The catalog lists no other.
func servable(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) <= MaxServiceName
}
