package auth

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
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
//	/v1/chains                      the list of chains
//	/v1/chains/{chain}/...          /v1/chains/{chain}/*   (every key of the chain)
//	/v1/sd/indexes/{index}          /v1/indexes/{index}/*  (Prometheus service discovery)
//	/v1/sd/chains/{chain}           /v1/chains/{chain}/*
//	Consul facade: a service        /v1/chains/{chain}/* or /v1/indexes/{index}/*, of each
//	                                chain or index that serves it (see Check)
//	/v1/resources/{resource}/...    /v1/resources/{resource}/*  (every object's fields)
//	/metrics                        /metrics
//	/v1/xds/clients                 /v1/xds/clients        (each xDS client's node and versions)
//	xDS target indexes/{index}/KEY  /v1/indexes/{index}/*  (as its HTTP lookup, see Check)
//	xDS target chains/{chain}/KEY   /v1/chains/{chain}/*
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

// Wrap returns h behind the guard. An authorized request reaches h with
// its Caller in its context (CallerFrom); a /readyz?verbose whose caller
// may not see the reasons reaches it without ?verbose, and with why
// (WithheldFrom).
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
		// the lookups, as it goes. What a request reads beyond its path
		// (the steps of an explained chain) is asked for with the same
		// token and caches.
		c := Caller{
			Name:    CallerName(v.user),
			Recheck: func() int { return a.checkRequest(r, thing).code },
			MayGet: func(other string) (int, string) {
				v := a.checkRequest(r, other)
				return v.code, v.msg
			},
		}
		h.ServeHTTP(w, r.WithContext(WithCaller(r.Context(), c)))
	})
}

const msgNoToken = "a bearer token is required"

// withoutVerbose is r without ?verbose, carrying why for /readyz to say.
func withoutVerbose(r *http.Request, note string) *http.Request {
	q := r.URL.Query()
	q.Del("verbose")
	u := *r.URL
	u.RawQuery = q.Encode()
	r2 := r.WithContext(WithWithheld(r.Context(), note))
	r2.URL = &u
	return r2
}

// accessPath names what a request reads, as the non-resource URL that
// SubjectAccessReview asks about: one per index or chain (not per key),
// /v1/indexes and /metrics themselves, and otherPaths for any other path
// (which is no API resource: one review covers them all). The index or
// chain is the path segment as sent (still escaped), the one that
// ServeMux matches.
func accessPath(u *url.URL) string {
	p := u.EscapedPath()
	// Service discovery reads what the lookups of its chain or index do.
	if rest, ok := strings.CutPrefix(p, "/v1/sd/"); ok {
		p = "/v1/" + rest + "/"
	}
	for _, prefix := range []string{"/v1/indexes/", "/v1/chains/", "/v1/resources/"} {
		if rest, ok := strings.CutPrefix(p, prefix); ok {
			name, _, _ := strings.Cut(rest, "/")
			if name != "" {
				return prefix + name + "/*"
			}
		}
	}
	switch u.Path {
	case "/v1/indexes", "/v1/chains", "/metrics", "/v1/xds/clients":
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

// Check authenticates the bearer token of r and, unless thing is "",
// asks whether its user may get thing, from the caches and with the
// limits of the HTTP API's requests: it answers the user's name and 0,
// or the HTTP status that refuses r (401, 403, or 503 when a review
// failed or too many are in flight) and why. Faces other than HTTP (the
// xDS server) authorize through it: an xDS target asks what the HTTP
// lookup of the same key asks, /v1/indexes/{index}/* or
// /v1/chains/{chain}/*.
func (a *TokenAuth) Check(r *http.Request, thing string) (user string, code int, msg string) {
	var v verdict
	if thing == "" {
		v = a.who(r)
	} else {
		v = a.checkRequest(r, thing)
	}
	return v.user.Username, v.code, v.msg
}

// who authenticates r's bearer token.
func (a *TokenAuth) who(r *http.Request) verdict {
	token, ok := bearer(r.Header.Get("Authorization"))
	if !ok || token == "" {
		return verdict{code: http.StatusUnauthorized, msg: msgNoToken}
	}
	return a.decide(r.Context(), sha256.Sum256([]byte("token\x00"+token)), a.tokenGate, [32]byte{}, a.users, a.badTokens, func(ctx context.Context) (verdict, error) {
		return a.authenticate(ctx, token)
	})
}

// checkRequest authenticates r's bearer token and asks whether its user
// may get thing.
func (a *TokenAuth) checkRequest(r *http.Request, thing string) verdict {
	who := a.who(r)
	if who.code != 0 {
		return who
	}
	ctx := r.Context()
	user := who.user
	id := identityKey(user)
	v := a.decide(ctx, accessKey(id, thing), a.accessGate, id, a.allowed, a.forbidden, func(ctx context.Context) (verdict, error) {
		return a.authorize(ctx, user, thing)
	})
	v.user = user // who the caller is, for the per-caller limits
	return v
}

// Lifetimes are how long the guard's verdicts live and how long it waits
// for a review; NewTokenAuth sets the daemon's (see TokenAuth). Tests
// shorten them.
type Lifetimes struct {
	Positive, Negative time.Duration // verdicts that allow; 401 and 403
	Review             time.Duration // one review's timeout
	Grace              time.Duration // a positive verdict whose refresh fails, past its expiry
}

// SetLifetimes changes the lifetimes: the zero ones keep theirs. Call it
// before the guard serves.
func (a *TokenAuth) SetLifetimes(l Lifetimes) {
	for _, f := range []struct {
		to *time.Duration
		v  time.Duration
	}{{&a.ttl, l.Positive}, {&a.negativeTTL, l.Negative}, {&a.timeout, l.Review}, {&a.grace, l.Grace}} {
		if f.v > 0 {
			*f.to = f.v
		}
	}
}
