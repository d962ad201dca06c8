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
	"k8s.io/client-go/kubernetes"
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
//	any other path                  the path itself
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
// access per identity and index, chain or path. Positive verdicts live
// for 10 s and are refreshed in the background after 5 s while in use;
// 401 and 403 for 5 s, in caches of their own, so that a flood of made-up
// tokens cannot push out the callers that are known. A review that fails
// (the apiserver unreachable, a timeout) is never cached: that request
// gets 503. Identical reviews in flight are made once. At most 16 reviews
// of tokens not known run at once; beyond that a request with a token not
// known gets 503 with Retry-After at once.
type TokenAuth struct {
	kube kubernetes.Interface
	log  *slog.Logger

	ttl, negativeTTL time.Duration
	timeout          time.Duration
	slots            chan struct{} // reviews of tokens not known in flight

	mu                 sync.Mutex
	users, badTokens   *lru // token hash → identity; → 401
	allowed, forbidden *lru // identity and thing hash → allowed; → 403
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
	reviewTimeout  = 5 * time.Second
	positiveTTL    = 10 * time.Second
	negativeTTL    = 5 * time.Second

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

// NewTokenAuth builds the guard; kube must be allowed to create
// tokenreviews and subjectaccessreviews (the system:auth-delegator role).
// Give kube a client of its own (its own rate limits): the guard makes at
// most a few reviews per caller and index every few seconds, and turns
// unknown tokens away rather than queueing them.
func NewTokenAuth(kube kubernetes.Interface, log *slog.Logger) *TokenAuth {
	return &TokenAuth{
		kube:        kube,
		log:         log,
		ttl:         positiveTTL,
		negativeTTL: negativeTTL,
		timeout:     reviewTimeout,
		slots:       make(chan struct{}, unknownReviews),
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
			Help: "Requests with a token not known answered 503 at once because every review slot was in use.",
		}),
		failLog: rate.Sometimes{First: 3, Interval: 10 * time.Second},
		busyLog: rate.Sometimes{First: 1, Interval: 10 * time.Second},
	}
}

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
		v := a.checkRequest(r, accessPath(r.URL))
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
		h.ServeHTTP(w, r)
	})
}

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
// the request's path otherwise. The index or chain is the path segment as
// sent (still escaped), the one that ServeMux matches.
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
	return u.Path
}

// checkRequest authenticates r's bearer token and asks whether its user
// may get thing.
func (a *TokenAuth) checkRequest(r *http.Request, thing string) verdict {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	token = strings.TrimSpace(token)
	if !ok || token == "" {
		return verdict{code: http.StatusUnauthorized, msg: msgNoToken}
	}
	ctx := r.Context()
	who := a.decide(ctx, sha256.Sum256([]byte("token\x00"+token)), true, a.users, a.badTokens, func(ctx context.Context) (verdict, error) {
		return a.authenticate(ctx, token)
	})
	if who.code != 0 {
		return who
	}
	user := who.user
	return a.decide(ctx, accessKey(user, thing), false, a.allowed, a.forbidden, func(ctx context.Context) (verdict, error) {
		return a.authorize(ctx, user, thing)
	})
}

// accessKey is the cache key of an access decision: the whole identity
// (name, UID, groups, extra) and the thing accessed.
func accessKey(u authenticationv1.UserInfo, thing string) [32]byte {
	groups := slices.Clone(u.Groups)
	slices.Sort(groups)
	extra := make([][]string, 0, len(u.Extra))
	for k, v := range u.Extra {
		extra = append(extra, append([]string{k}, v...))
	}
	slices.SortFunc(extra, func(x, y []string) int { return strings.Compare(x[0], y[0]) })
	b, _ := json.Marshal([]any{u.Username, u.UID, groups, extra, thing})
	return sha256.Sum256(append([]byte("access\x00"), b...))
}

// flight is one review in progress; every request asking the same shares it.
type flight struct {
	done chan struct{}
	v    verdict
	err  error
}

// decide answers from the caches, or from a review that runs once for
// every request waiting on the same key. A positive verdict past half its
// life is refreshed in the background while it keeps answering. With
// unknown set, a key never seen allowed needs a review slot: when none is
// free, the answer is 503 at once.
func (a *TokenAuth) decide(ctx context.Context, key [32]byte, unknown bool, pos, neg *lru, review func(context.Context) (verdict, error)) verdict {
	now := time.Now()
	a.mu.Lock()
	known := false
	if e, ok := pos.get(key); ok {
		if now.Before(e.expires) {
			if now.After(e.refresh) && a.flights[key] == nil {
				a.start(key, nil, pos, neg, review)
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
		var slot chan struct{}
		if unknown && !known {
			select {
			case a.slots <- struct{}{}:
				slot = a.slots
			default:
				a.mu.Unlock()
				a.busy.Inc()
				a.turnedAway.Add(1)
				a.busyLog.Do(func() {
					a.log.Warn("too many tokens under review: turning tokens not known away", "turned_away", a.turnedAway.Swap(0))
				})
				return verdict{code: http.StatusServiceUnavailable, msg: "too many tokens under review; retry later"}
			}
		}
		f = a.start(key, slot, pos, neg, review)
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
// and records its verdict unless it failed. a.mu is held.
func (a *TokenAuth) start(key [32]byte, slot chan struct{}, pos, neg *lru, review func(context.Context) (verdict, error)) *flight {
	f := &flight{done: make(chan struct{})}
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
		case v.code == 0:
			neg.remove(key)
			pos.put(key, entry{v: v, expires: now.Add(a.ttl), refresh: now.Add(a.ttl / 2)})
		default:
			pos.remove(key)
			neg.put(key, entry{v: v, expires: now.Add(a.negativeTTL)})
		}
		a.mu.Unlock()
		f.v, f.err = v, err
		close(f.done)
		if slot != nil {
			<-slot
		}
	}()
	return f
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
	tr, err := a.kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token},
	}, metav1.CreateOptions{})
	if err != nil {
		return verdict{}, a.reviewFailed("token", "token review", err)
	}
	if !tr.Status.Authenticated {
		a.reviews.WithLabelValues("token", "denied").Inc()
		return verdict{code: http.StatusUnauthorized, msg: "the token is not valid"}, nil
	}
	a.reviews.WithLabelValues("token", "ok").Inc()
	return verdict{user: tr.Status.User}, nil
}

func (a *TokenAuth) authorize(ctx context.Context, u authenticationv1.UserInfo, thing string) (verdict, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := a.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: thing, Verb: "get"},
		},
	}, metav1.CreateOptions{})
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

// entry is a cached verdict.
type entry struct {
	v                verdict
	expires, refresh time.Time
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
