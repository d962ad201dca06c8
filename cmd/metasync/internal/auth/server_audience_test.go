package auth_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/test/authtest"
	"github.com/iidp/metasync/test/testenv"
)

// audienceToken is a fresh token of ServiceAccount sa issued for
// audience ("": the apiserver's own).
func audienceToken(t *testing.T, sa, audience string) string {
	t.Helper()
	req := &authenticationv1.TokenRequest{}
	if audience != "" {
		req.Spec.Audiences = []string{audience}
	}
	tr, err := env.Kube.CoreV1().ServiceAccounts(authtest.NS).CreateToken(context.Background(), sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// TestAuthAudience: with an audience set, a token for the apiserver's
// default audience (which the apiserver itself accepts: a cluster
// credential) is refused with 401, and a token issued for the audience
// is accepted, while the apiserver refuses that one for its own API.
// Without an audience, as before, the apiserver's tokens are accepted
// and the audience's are not.
func TestAuthAudience(t *testing.T) {
	testenv.Need(t, env)
	authtest.Identities(t, env)
	const audience = "metasync-test"
	clusterToken := audienceToken(t, "reader", "")
	ownToken := audienceToken(t, "reader", audience)

	guard := newGuard(t, env.Config, quietLog())
	guard.SetAudience(audience)
	srv := httptest.NewServer(guard.Wrap(offlineServer(t)))
	defer srv.Close()
	url := srv.URL + "/v1/indexes/model-to-app/keys/model1"
	if code, body := getWith(t, http.DefaultClient, url, clusterToken); code != http.StatusUnauthorized || !strings.Contains(body, `not valid for audience \"metasync-test\"`) {
		t.Fatalf("a token for the apiserver's audience: %d %s, want 401", code, body)
	}
	if code, body := getWith(t, http.DefaultClient, url, ownToken); code != http.StatusOK {
		t.Fatalf("a token for %s: %d %s, want 200", audience, code, body)
	}

	// What a caller hands metasync is no cluster credential: the
	// apiserver refuses the audience's token, and accepts the other.
	asCaller := func(token string) error {
		cfg := rest.AnonymousClientConfig(env.Config)
		cfg.BearerToken = token
		kube, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = kube.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{Limit: 1})
		return err
	}
	if err := asCaller(ownToken); !apierrors.IsUnauthorized(err) {
		t.Fatalf("the apiserver with a token for %s: %v, want Unauthorized", audience, err)
	}
	if err := asCaller(clusterToken); err != nil && !apierrors.IsForbidden(err) {
		t.Fatalf("the apiserver with a token for its own audience: %v, want it authenticated", err)
	}

	// No audience: the apiserver's audience, as before.
	plain := guarded(t, env.Config, quietLog())
	url = plain.URL + "/v1/indexes/model-to-app/keys/model1"
	if code, body := getWith(t, http.DefaultClient, url, clusterToken); code != http.StatusOK {
		t.Fatalf("no audience set, a token for the apiserver: %d %s, want 200", code, body)
	}
	if code, body := getWith(t, http.DefaultClient, url, ownToken); code != http.StatusUnauthorized {
		t.Fatalf("no audience set, a token for %s: %d %s, want 401", audience, code, body)
	}
}

// TestAuthStreamEndsWhenReviewsCannotBeMade: a stream whose periodic
// re-authorization cannot be made (here the daemon's own right to review
// tokens and access is taken away: its reviews fail with 403, the
// request would get 503) ends once the cached verdict's grace is over
// and re-authorization has failed for a heartbeat period; the reconnect
// gets 503. Before, a 503 of the re-check was ignored and the stream ran
// on for good.
func TestAuthStreamEndsWhenReviewsCannotBeMade(t *testing.T) {
	testenv.Need(t, env)
	reader, _, _ := authtest.Identities(t, env)
	ctx := context.Background()

	// The daemon's own identity, allowed to review (system:auth-delegator)
	// by a binding of its own.
	const user, binding = "metasync-reviewer", "metasync-api-test-reviewer"
	_, reviewerCfg := env.UserKubeconfig(t, user)
	if _, err := env.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	defer func() { _ = env.Kube.RbacV1().ClusterRoleBindings().Delete(ctx, binding, metav1.DeleteOptions{}) }()

	const heartbeat = 100 * time.Millisecond
	s := offlineServer(t)
	s.SetHeartbeat(heartbeat)
	guard := newGuard(t, reviewerCfg, quietLog())
	guard.SetLifetimes(auth.Lifetimes{Positive: 300 * time.Millisecond, Grace: 300 * time.Millisecond})
	srv := httptest.NewServer(guard.Wrap(s))
	defer srv.Close()
	target := srv.URL + "/v1/indexes/model-to-app/keys/m?watch=true"
	var resp *http.Response
	testenv.Eventually(t, "the stream opens (RBAC has seen the reviewer's binding)", func() string {
		req, _ := http.NewRequest("GET", target, nil)
		req.Header.Set("Authorization", "Bearer "+reader)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			return err.Error()
		}
		if r.StatusCode != 200 {
			r.Body.Close()
			return r.Status
		}
		resp = r
		return ""
	})
	defer resp.Body.Close()
	ended := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, resp.Body); close(ended) }()
	select {
	case <-ended:
		t.Fatal("the stream ended while its reviews worked")
	case <-time.After(time.Second): // several verdict lifetimes, refreshed
	}

	if err := env.Kube.RbacV1().ClusterRoleBindings().Delete(ctx, binding, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	select {
	case <-ended:
		t.Logf("the stream ended %v after the reviewer lost its binding", time.Since(deleted).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("the stream ran on 15 s after its re-authorization could no longer be made")
	}
	if code, body := getWith(t, http.DefaultClient, target, reader); code != http.StatusServiceUnavailable {
		t.Fatalf("reconnect: %d %s, want 503", code, body)
	}
}
