package api

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/kubejson"
)

// TokenAuth guards the API with Kubernetes bearer tokens, as
// kube-rbac-proxy does: TokenReview authenticates the caller (401 when it
// fails), then SubjectAccessReview asks whether the caller may "get" what
// the request reads, as a non-resource URL (403 when not):
//
//	/v1/indexes                     the list of indexes
//	/v1/indexes/{index}/...         /v1/indexes/{index}/*  (every key of the index)
//	/v1/chains/{chain}/...          /v1/chains/{chain}/*   (every key of the chain)
//	/metrics                        /metrics
//	/readyz?verbose                 /readyz/verbose        (the reasons, see below)
//	any other path                  /v1/*                  (one answer for every path)
//
// Access is granted per index or chain, never per key. Grant it with a
// ClusterRole rule such as
//
//	nonResourceURLs: ["/v1/*", "/metrics"]          # everything
//	nonResourceURLs: ["/v1/indexes/model-to-app/*"] # one index
//	verbs: ["get"]
//
// /livez and /readyz stay open for probes; /readyz?verbose (the reasons,
// which name the apiserver, namespaces, selectors and RBAC errors) needs
// a token allowed to get /readyz/verbose (Kubernetes' system:monitoring
// role grants "/readyz/*"); without one, /readyz answers its short form,
// with the same status code, and says why in "verbose".
//
// Verdicts are cached: the caller's identity per token (by its SHA-256),
// access per identity and index or chain. Positive verdicts live for
// 10 s and are refreshed in the background after 5 s while in use; 401
// and 403 for 5 s, in caches of their own, so that a flood of made-up
// tokens cannot push out the callers that are known. A review that fails
// (the apiserver unreachable, a timeout) is never cached: that request
// gets 503. Identical reviews in flight are made once.
//
// No flood, of tokens not known or of a known caller asking for things it
// was never granted, changes what a caller with a cached positive verdict
// gets:
//
//   - At most 16 reviews of tokens not known run at once, and at most 32
//     reviews of access not granted before (at most 4 per identity);
//     beyond that the request gets 503 with Retry-After at once instead
//     of queueing at the review client's rate limit. Refreshes of
//     positive verdicts, and reviews of access that was granted before,
//     take no slot. Paths that are no API resource all ask for /v1/*, so
//     made-up paths cost one review per identity, not one per path.
//   - A failed review is not a denial: while the refresh of a positive
//     verdict fails (or is still waiting at expiry), the verdict keeps
//     answering, retried at most once a second, for up to 50 s past its
//     expiry (never more than 60 s after the last review that granted
//     it); then requests get 503. A refresh answered 401 or 403 takes
//     effect at once.
type TokenAuth struct {
	kube     *kubejson.Client
	log      *slog.Logger
	audience string // asked of every TokenReview; "" for the apiserver's own

	ttl, negativeTTL time.Duration
	timeout, grace   time.Duration

	mu                 sync.Mutex
	tokenGate          *gate // reviews of tokens not known
	accessGate         *gate // reviews of access not granted before
	users, badTokens   *lru  // token hash → identity; → 401
	allowed, forbidden *lru  // identity and thing hash → allowed; → 403
	flights            map[[32]byte]*flight

	reviews    *prometheus.CounterVec
	busy       prometheus.Counter
	failures   atomic.Int64 // review errors since the last warning
	turnedAway atomic.Int64 // busy answers since the last warning
	failLog    rate.Sometimes
	busyLog    rate.Sometimes
}

// The cache sizes and limits of TokenAuth.
const (
	knownCached    = 4096 // positive verdicts, per cache
	negativeCached = 1024 // 401 and 403 verdicts, per cache
	unknownReviews = 16   // concurrent reviews of tokens not known
	accessReviews  = 32   // concurrent reviews of access not granted before
	accessPerUser  = 4    // of which for one identity
	reviewTimeout  = 5 * time.Second
	positiveTTL    = 10 * time.Second
	negativeTTL    = 5 * time.Second
	staleGrace     = 50 * time.Second // a positive verdict whose refresh fails, past its expiry
	retryFailed    = time.Second      // between refreshes of a positive verdict that fail

	// otherPaths is what any path that is no API resource asks access to.
	otherPaths = "/v1/*"

	// readyzVerbose is what /readyz?verbose asks access to.
	readyzVerbose = "/readyz/verbose"
)

// verdict is the outcome of a review: who the caller is (authentication)
// and whether it may go on (code 0), or the error answer.
type verdict struct {
	user authenticationv1.UserInfo
	code int // 0 when authenticated or allowed
	msg  string
}

// NewTokenAuth builds the guard, whose reviews go to the cluster of cfg;
// cfg's user must be allowed to create tokenreviews and
// subjectaccessreviews (the system:auth-delegator role). Give cfg rate
// limits of its own: the guard makes at most a few reviews per caller and
// index every few seconds, and turns unknown tokens away rather than
// queueing them.
func NewTokenAuth(cfg *rest.Config, log *slog.Logger) (*TokenAuth, error) {
	kube, err := kubejson.New(cfg)
	if err != nil {
		return nil, err
	}
	return &TokenAuth{
		kube:        kube,
		log:         log,
		ttl:         positiveTTL,
		negativeTTL: negativeTTL,
		timeout:     reviewTimeout,
		grace:       staleGrace,
		tokenGate:   &gate{max: unknownReviews, busy: "too many tokens under review; retry later"},
		accessGate:  &gate{max: accessReviews, perOwner: accessPerUser, owners: map[[32]byte]int{}, busy: "too many access reviews; retry later"},
		users:       newLRU(knownCached),
		badTokens:   newLRU(negativeCached),
		allowed:     newLRU(knownCached),
		forbidden:   newLRU(negativeCached),
		flights:     map[[32]byte]*flight{},
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metasync_auth_reviews_total",
			Help: "TokenReviews (review=token) and SubjectAccessReviews (review=access) sent to the apiserver, by result (ok, denied, error).",
		}, []string{"review", "result"}),
		busy: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metasync_auth_busy_total",
			Help: "Requests answered 503 at once because every review slot was in use (for tokens not known, or for access not granted before).",
		}),
		failLog: rate.Sometimes{First: 3, Interval: 10 * time.Second},
		busyLog: rate.Sometimes{First: 1, Interval: 10 * time.Second},
	}, nil
}

// SetAudience makes the guard accept only tokens issued for audience (a
// projected service account token with that audience): each TokenReview
// asks for it (spec.audiences), and a token is authenticated only when
// the review's answer names it among the token's audiences that match
// (status.audiences). A token for the apiserver's default audience, which
// the apiserver itself would accept, is then refused with 401: callers
// hand metasync nothing that works as a cluster credential. "" (the
// default) accepts tokens for the apiserver's audience. Call it before
// the guard serves.
func (a *TokenAuth) SetAudience(audience string) { a.audience = audience }

// Describe implements prometheus.Collector.
func (a *TokenAuth) Describe(ch chan<- *prometheus.Desc) {
	a.reviews.Describe(ch)
	a.busy.Describe(ch)
}

// Collect implements prometheus.Collector.
func (a *TokenAuth) Collect(ch chan<- prometheus.Metric) {
	a.reviews.Collect(ch)
	a.busy.Collect(ch)
}

type verboseNoteKey struct{}

// Wrap returns h behind the guard.
func (a *TokenAuth) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/livez":
			h.ServeHTTP(w, r)
			return
		case "/readyz":
			if _, verbose := r.URL.Query()["verbose"]; verbose {
				if v := a.checkRequest(r, readyzVerbose); v.code != 0 {
					r = withoutVerbose(r, "details withheld: "+v.msg)
				}
			}
			h.ServeHTTP(w, r)
			return
		}
		thing := accessPath(r.URL)
		v := a.checkRequest(r, thing)
		if v.code != 0 {
			switch v.code {
			case http.StatusUnauthorized:
				if v.msg == msgNoToken {
					w.Header().Set("WWW-Authenticate", `Bearer realm="metasync"`)
				} else {
					w.Header().Set("WWW-Authenticate", `Bearer realm="metasync", error="invalid_token"`)
				}
			case http.StatusServiceUnavailable:
				w.Header().Set("Retry-After", "1")
			}
			writeError(w, v.code, v.msg)
			return
		}
		// A change stream lasts: it asks again, from the same caches as
		// the lookups, as it goes (see Server.stream).
		recheck := func() int { return a.checkRequest(r, thing).code }
		ctx := context.WithValue(r.Context(), recheckKey{}, recheck)
		ctx = context.WithValue(ctx, callerKey{}, callerName(v.user))
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// recheckKey carries, in an authorized request's context, a function that
// authorizes the request again: 0, or the status that would refuse it now.
type recheckKey struct{}

const msgNoToken = "a bearer token is required"

// withoutVerbose is r without ?verbose, carrying why for /readyz to say.
func withoutVerbose(r *http.Request, note string) *http.Request {
	q := r.URL.Query()
	q.Del("verbose")
	u := *r.URL
	u.RawQuery = q.Encode()
	r2 := r.WithContext(context.WithValue(r.Context(), verboseNoteKey{}, note))
	r2.URL = &u
	return r2
}

// verboseNote is why TokenAuth took ?verbose away from r, or "".
func verboseNote(r *http.Request) string {
	s, _ := r.Context().Value(verboseNoteKey{}).(string)
	return s
}

// accessPath names what a request reads, as the non-resource URL that
// SubjectAccessReview asks about: one per index or chain (not per key),
// /v1/indexes and /metrics themselves, and otherPaths for any other path
// (which is no API resource: one review covers them all). The index or
// chain is the path segment as sent (still escaped), the one that
// ServeMux matches.
func accessPath(u *url.URL) string {
	p := u.EscapedPath()
	for _, prefix := range []string{"/v1/indexes/", "/v1/chains/"} {
		if rest, ok := strings.CutPrefix(p, prefix); ok {
			name, _, _ := strings.Cut(rest, "/")
			if name != "" {
				return prefix + name + "/*"
			}
		}
	}
	switch u.Path {
	case "/v1/indexes", "/metrics":
		return u.Path
	}
	return otherPaths
}

// bearer returns the token of an Authorization header of the Bearer
// scheme, whose name is matched in any case (RFC 7235, as the apiserver
// reads it).
func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(token), true
}

// checkRequest authenticates r's bearer token and asks whether its user
// may get thing.
func (a *TokenAuth) checkRequest(r *http.Request, thing string) verdict {
	token, ok := bearer(r.Header.Get("Authorization"))
	if !ok || token == "" {
		return verdict{code: http.StatusUnauthorized, msg: msgNoToken}
	}
	ctx := r.Context()
	who := a.decide(ctx, sha256.Sum256([]byte("token\x00"+token)), a.tokenGate, [32]byte{}, a.users, a.badTokens, func(ctx context.Context) (verdict, error) {
		return a.authenticate(ctx, token)
	})
	if who.code != 0 {
		return who
	}
	user := who.user
	id := identityKey(user)
	v := a.decide(ctx, accessKey(id, thing), a.accessGate, id, a.allowed, a.forbidden, func(ctx context.Context) (verdict, error) {
		return a.authorize(ctx, user, thing)
	})
	v.user = user // who the caller is, for the per-caller limits
	return v
}

// identityKey hashes the whole identity (name, UID, groups, extra).
func identityKey(u authenticationv1.UserInfo) [32]byte {
	groups := slices.Clone(u.Groups)
	slices.Sort(groups)
	extra := make([][]string, 0, len(u.Extra))
	for k, v := range u.Extra {
		extra = append(extra, append([]string{k}, v...))
	}
	slices.SortFunc(extra, func(x, y []string) int { return strings.Compare(x[0], y[0]) })
	b, _ := json.Marshal([]any{u.Username, u.UID, groups, extra})
	return sha256.Sum256(append([]byte("identity\x00"), b...))
}

// accessKey is the cache key of an access decision: the identity and the
// thing accessed.
func accessKey(id [32]byte, thing string) [32]byte {
	return sha256.Sum256(append(append([]byte("access\x00"), id[:]...), thing...))
}

// gate bounds the reviews of keys never seen allowed, in total and per
// owner (an identity). It is guarded by TokenAuth.mu.
type gate struct {
	max, perOwner int
	inFlight      int
	owners        map[[32]byte]int
	busy          string // the answer when full
}

func (g *gate) enter(owner [32]byte) bool {
	if g.inFlight >= g.max || (g.perOwner > 0 && g.owners[owner] >= g.perOwner) {
		return false
	}
	g.inFlight++
	if g.perOwner > 0 {
		g.owners[owner]++
	}
	return true
}

func (g *gate) leave(owner [32]byte) {
	g.inFlight--
	if g.perOwner > 0 {
		if g.owners[owner]--; g.owners[owner] <= 0 {
			delete(g.owners, owner)
		}
	}
}

// flight is one review in progress; every request asking the same shares it.
type flight struct {
	done       chan struct{}
	background bool // the refresh of a positive verdict
	v          verdict
	err        error
}

// decide answers from the caches, or from a review that runs once for
// every request waiting on the same key. A positive verdict past half its
// life is refreshed in the background while it keeps answering; past its
// expiry it keeps answering for a grace period while its refresh fails or
// is still on its way. A key never seen allowed needs a place in g (for
// owner): when there is none, the answer is 503 at once.
func (a *TokenAuth) decide(ctx context.Context, key [32]byte, g *gate, owner [32]byte, pos, neg *lru, review func(context.Context) (verdict, error)) verdict {
	now := time.Now()
	a.mu.Lock()
	known := false
	if e, ok := pos.get(key); ok {
		f := a.flights[key]
		late := f != nil && f.background // a refresh started in time, still on its way
		if now.Before(e.expires) || (now.Before(e.stale) && (e.failing || late)) {
			if now.After(e.refresh) && f == nil {
				a.start(key, nil, true, pos, neg, review)
			}
			a.mu.Unlock()
			return e.v
		}
		known = true // expired, yet this token or access was good: no slot needed
	}
	if e, ok := neg.get(key); ok && now.Before(e.expires) {
		a.mu.Unlock()
		return e.v
	}
	f := a.flights[key]
	if f == nil {
		var slot *gate
		if !known {
			if !g.enter(owner) {
				a.mu.Unlock()
				a.busy.Inc()
				a.turnedAway.Add(1)
				a.busyLog.Do(func() {
					a.log.Warn("too many reviews: turning requests not known away", "turned_away", a.turnedAway.Swap(0))
				})
				return verdict{code: http.StatusServiceUnavailable, msg: g.busy}
			}
			slot = g
		}
		f = a.start(key, func() {
			if slot != nil {
				slot.leave(owner)
			}
		}, false, pos, neg, review)
	}
	a.mu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		return verdict{code: http.StatusServiceUnavailable, msg: "request ended before the review"}
	}
	if f.err != nil {
		return verdict{code: http.StatusServiceUnavailable, msg: f.err.Error()}
	}
	return f.v
}

// start runs a review in its own goroutine, detached from any request,
// and records its verdict. A failed review is not recorded, except that a
// positive verdict it was to refresh is marked failing (it keeps
// answering until its stale time) and retried no sooner than retryFailed.
// done, if not nil, runs with a.mu held when the review ends. a.mu is held.
func (a *TokenAuth) start(key [32]byte, done func(), background bool, pos, neg *lru, review func(context.Context) (verdict, error)) *flight {
	f := &flight{done: make(chan struct{}), background: background}
	a.flights[key] = f
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		v, err := review(ctx)
		cancel()
		now := time.Now()
		a.mu.Lock()
		delete(a.flights, key)
		switch {
		case err != nil: // never cached: the next request asks again
			if e, ok := pos.peek(key); ok {
				e.failing = true
				e.refresh = now.Add(retryFailed)
				pos.update(key, e)
			}
		case v.code == 0:
			neg.remove(key)
			expires := now.Add(a.ttl)
			pos.put(key, entry{v: v, expires: expires, refresh: now.Add(a.ttl / 2), stale: expires.Add(a.grace)})
		default:
			pos.remove(key)
			neg.put(key, entry{v: v, expires: now.Add(a.negativeTTL)})
		}
		if done != nil {
			done()
		}
		a.mu.Unlock()
		f.v, f.err = v, err
		close(f.done)
	}()
	return f
}

// typeMeta is the apiVersion and kind a review is sent with.
func typeMeta(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}

// reviewFailed counts a failed review and logs it, at most a few times
// every 10 s.
func (a *TokenAuth) reviewFailed(kind, what string, err error) error {
	a.reviews.WithLabelValues(kind, "error").Inc()
	a.failures.Add(1)
	a.failLog.Do(func() {
		a.log.Warn(what+" failed", "error", err.Error(), "failures", a.failures.Swap(0))
	})
	return errors.New("cannot review the " + kind + " now")
}

func (a *TokenAuth) authenticate(ctx context.Context, token string) (verdict, error) {
	spec := authenticationv1.TokenReviewSpec{Token: token}
	if a.audience != "" {
		spec.Audiences = []string{a.audience}
	}
	tr := &authenticationv1.TokenReview{}
	err := a.kube.Create(ctx, "/apis/authentication.k8s.io/v1/tokenreviews", &authenticationv1.TokenReview{
		TypeMeta: typeMeta("authentication.k8s.io/v1", "TokenReview"),
		Spec:     spec,
	}, tr)
	if err != nil {
		return verdict{}, a.reviewFailed("token", "token review", err)
	}
	// The apiserver answers the audiences that both the review and the
	// token name; an authenticator that knows nothing of audiences
	// answers none, and its "authenticated" says nothing of ours.
	if !tr.Status.Authenticated || (a.audience != "" && !slices.Contains(tr.Status.Audiences, a.audience)) {
		a.reviews.WithLabelValues("token", "denied").Inc()
		msg := "the token is not valid"
		if a.audience != "" {
			msg = fmt.Sprintf("the token is not valid for audience %q", a.audience)
		}
		return verdict{code: http.StatusUnauthorized, msg: msg}, nil
	}
	a.reviews.WithLabelValues("token", "ok").Inc()
	return verdict{user: tr.Status.User}, nil
}

func (a *TokenAuth) authorize(ctx context.Context, u authenticationv1.UserInfo, thing string) (verdict, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{}
	err := a.kube.Create(ctx, "/apis/authorization.k8s.io/v1/subjectaccessreviews", &authorizationv1.SubjectAccessReview{
		TypeMeta: typeMeta("authorization.k8s.io/v1", "SubjectAccessReview"),
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: thing, Verb: "get"},
		},
	}, sar)
	if err != nil {
		return verdict{}, a.reviewFailed("access", "access review", err)
	}
	if !sar.Status.Allowed {
		a.reviews.WithLabelValues("access", "denied").Inc()
		return verdict{code: http.StatusForbidden, msg: fmt.Sprintf("%s may not get %s", u.Username, thing)}, nil
	}
	a.reviews.WithLabelValues("access", "ok").Inc()
	return verdict{user: u}, nil
}

// entry is a cached verdict. A positive one answers until expires, or
// until stale while its refresh fails (failing) or is late.
type entry struct {
	v                       verdict
	expires, refresh, stale time.Time
	failing                 bool
}

// lru is a bounded cache that drops its least recently used entry when
// full. It is not safe for concurrent use.
type lru struct {
	max   int
	order *list.List // of *lruItem, most recent first
	items map[[32]byte]*list.Element
}

type lruItem struct {
	key [32]byte
	e   entry
}

func newLRU(max int) *lru {
	return &lru{max: max, order: list.New(), items: map[[32]byte]*list.Element{}}
}

func (c *lru) get(k [32]byte) (entry, bool) {
	el, ok := c.items[k]
	if !ok {
		return entry{}, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*lruItem).e, true
}

// peek is get without making k the most recent.
func (c *lru) peek(k [32]byte) (entry, bool) {
	el, ok := c.items[k]
	if !ok {
		return entry{}, false
	}
	return el.Value.(*lruItem).e, true
}

// update replaces k's entry, if still there, without making it the most
// recent.
func (c *lru) update(k [32]byte, e entry) {
	if el, ok := c.items[k]; ok {
		el.Value.(*lruItem).e = e
	}
}

func (c *lru) put(k [32]byte, e entry) {
	if el, ok := c.items[k]; ok {
		el.Value.(*lruItem).e = e
		c.order.MoveToFront(el)
		return
	}
	c.items[k] = c.order.PushFront(&lruItem{key: k, e: e})
	if c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.items, last.Value.(*lruItem).key)
	}
}

func (c *lru) remove(k [32]byte) {
	if el, ok := c.items[k]; ok {
		c.order.Remove(el)
		delete(c.items, k)
	}
}
