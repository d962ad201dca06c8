package api

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TokenAuth guards the API with Kubernetes bearer tokens: TokenReview
// authenticates the caller (401 when it fails), then SubjectAccessReview
// asks whether the caller may "get" the request's path as a non-resource
// URL (403 when not), as kube-rbac-proxy does. Grant access with a
// ClusterRole rule such as
//
//	nonResourceURLs: ["/v1/*", "/metrics"]
//	verbs: ["get"]
//
// /livez and /readyz stay open for probes. Answers are cached for a short
// while, per token and path.
type TokenAuth struct {
	kube kubernetes.Interface
	log  *slog.Logger
	ttl  time.Duration

	mu    sync.Mutex
	cache map[[32]byte]verdict
}

type verdict struct {
	code    int // 0 when allowed
	msg     string
	expires time.Time
}

// maxCached bounds the verdict cache; it is emptied when full.
const maxCached = 10000

// NewTokenAuth builds the guard; kube must be allowed to create
// tokenreviews and subjectaccessreviews (the system:auth-delegator role).
func NewTokenAuth(kube kubernetes.Interface, log *slog.Logger) *TokenAuth {
	return &TokenAuth{kube: kube, log: log, ttl: 10 * time.Second, cache: map[[32]byte]verdict{}}
}

// Wrap returns h behind the guard.
func (a *TokenAuth) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/livez" || r.URL.Path == "/readyz" {
			h.ServeHTTP(w, r)
			return
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || strings.TrimSpace(token) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="metasync"`)
			writeError(w, http.StatusUnauthorized, "a bearer token is required")
			return
		}
		v := a.check(r.Context(), strings.TrimSpace(token), r.URL.Path)
		if v.code != 0 {
			if v.code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="metasync", error="invalid_token"`)
			}
			writeError(w, v.code, v.msg)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (a *TokenAuth) check(ctx context.Context, token, path string) verdict {
	key := sha256.Sum256([]byte(token + "\x00" + path))
	now := time.Now()
	a.mu.Lock()
	v, ok := a.cache[key]
	a.mu.Unlock()
	if ok && now.Before(v.expires) {
		return v
	}
	v = a.review(ctx, token, path)
	v.expires = now.Add(a.ttl)
	a.mu.Lock()
	if len(a.cache) >= maxCached {
		clear(a.cache)
	}
	a.cache[key] = v
	a.mu.Unlock()
	return v
}

func (a *TokenAuth) review(ctx context.Context, token, path string) verdict {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tr, err := a.kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token},
	}, metav1.CreateOptions{})
	if err != nil {
		a.log.Warn("token review failed", "error", err.Error())
		return verdict{code: http.StatusServiceUnavailable, msg: "cannot review the token now"}
	}
	if !tr.Status.Authenticated {
		return verdict{code: http.StatusUnauthorized, msg: "the token is not valid"}
	}
	u := tr.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := a.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		a.log.Warn("access review failed", "error", err.Error())
		return verdict{code: http.StatusServiceUnavailable, msg: "cannot review the access now"}
	}
	if !sar.Status.Allowed {
		return verdict{code: http.StatusForbidden, msg: fmt.Sprintf("%s may not get %s", u.Username, path)}
	}
	return verdict{}
}
