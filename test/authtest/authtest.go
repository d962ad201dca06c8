// Package authtest is what the tests of the daemon's guard share on a
// real control plane (package testenv): ServiceAccounts with grants of
// the API's paths, their tokens, and a count of the reviews that reach
// the apiserver.
package authtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/test/testenv"
)

// NS is the namespace of the tests' ServiceAccounts.
const NS = "api-auth"

// Identities creates, once per control plane, three ServiceAccounts of
// NS: reader (may get /v1/* and /metrics), operator (may get /readyz/*)
// and nobody (no access), waits until RBAC says so, and returns a fresh
// token of each.
func Identities(t *testing.T, env *testenv.Env) (reader, operator, nobody string) {
	t.Helper()
	ctx := context.Background()
	env.Namespace(t, NS)
	grants := map[string][]string{"reader": {"/v1/*", "/metrics"}, "operator": {"/readyz/*"}, "nobody": nil}
	for sa, urls := range grants {
		_, err := env.Kube.CoreV1().ServiceAccounts(NS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if urls == nil {
			continue
		}
		name := "metasync-api-test-" + sa
		_, err = env.Kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules:      []rbacv1.PolicyRule{{NonResourceURLs: urls, Verbs: []string{"get"}}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		_, err = env.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: NS}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// RBAC's informers take a moment: a 403 cached meanwhile would spoil
	// the counts of the tests.
	for sa, path := range map[string]string{"reader": "/v1/indexes/x/*", "operator": "/readyz/verbose"} {
		WaitAllowed(t, env, sa, path)
	}
	return Token(t, env, "reader"), Token(t, env, "operator"), Token(t, env, "nobody")
}

// WaitAllowed waits until RBAC lets ServiceAccount sa of NS get path.
func WaitAllowed(t *testing.T, env *testenv.Env, sa, path string) {
	t.Helper()
	testenv.Eventually(t, sa+" may get "+path, func() string {
		r, err := env.Kube.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:                  "system:serviceaccount:" + NS + ":" + sa,
			Groups:                []string{"system:serviceaccounts", "system:serviceaccounts:" + NS, "system:authenticated"},
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"},
		}}, metav1.CreateOptions{})
		if err != nil {
			return err.Error()
		}
		if !r.Status.Allowed {
			return "not allowed yet"
		}
		return ""
	})
}

// Token returns a fresh token of ServiceAccount sa of NS.
func Token(t *testing.T, env *testenv.Env, sa string) string {
	t.Helper()
	tr, err := env.Kube.CoreV1().ServiceAccounts(NS).CreateToken(context.Background(), sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// ReviewCounter sits in the review client's transport: it counts the
// TokenReviews and SubjectAccessReviews that reach the apiserver, and
// fails the next FailTokens and FailAccess ones as an unreachable
// apiserver would.
type ReviewCounter struct {
	rt                          http.RoundTripper
	TokenReviews, AccessReviews atomic.Int64
	FailTokens, FailAccess      atomic.Int64
}

// RoundTrip implements http.RoundTripper.
func (c *ReviewCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	take := func(n *atomic.Int64) bool {
		for v := n.Load(); v > 0; v = n.Load() {
			if n.CompareAndSwap(v, v-1) {
				return true
			}
		}
		return false
	}
	switch {
	case strings.HasSuffix(req.URL.Path, "/tokenreviews"):
		if take(&c.FailTokens) {
			return nil, errors.New("injected: dial tcp: connection refused")
		}
		c.TokenReviews.Add(1)
	case strings.HasSuffix(req.URL.Path, "/subjectaccessreviews"):
		if take(&c.FailAccess) {
			return nil, errors.New("injected: dial tcp: connection refused")
		}
		c.AccessReviews.Add(1)
	}
	return c.rt.RoundTrip(req)
}

// Counts says how many reviews of each kind reached the apiserver.
func (c *ReviewCounter) Counts() string {
	return fmt.Sprintf("%d TokenReviews, %d SubjectAccessReviews", c.TokenReviews.Load(), c.AccessReviews.Load())
}

// CountingKube is a copy of cfg whose reviews the ReviewCounter counts.
func CountingKube(t *testing.T, cfg *rest.Config) (*rest.Config, *ReviewCounter) {
	t.Helper()
	c := &ReviewCounter{}
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { c.rt = rt; return c }
	return cfg, c
}
