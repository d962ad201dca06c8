package auth_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	gosync "sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/test/authtest"
	"github.com/iidp/metasync/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainLeakChecked(m, &env) }

// newGuard is NewTokenAuth, failing t on an error.
func newGuard(t *testing.T, cfg *rest.Config, log *slog.Logger) *auth.TokenAuth {
	t.Helper()
	a, err := auth.NewTokenAuth(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// guarded serves the offline API behind a TokenAuth of kube.
func guarded(t *testing.T, kube *rest.Config, log *slog.Logger) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(newGuard(t, kube, log).Wrap(offlineServer(t)))
	t.Cleanup(srv.Close)
	return srv
}

func getWith(t *testing.T, client *http.Client, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestAuthReviewsPerIndexNotPerKey: a caller looking up 50 keys of one
// index costs one TokenReview and one SubjectAccessReview; the key list of
// the index shares that decision; each other index, chain or endpoint one
// more SubjectAccessReview; another token of the same account one more
// TokenReview and no SubjectAccessReview; a bad token asked twice, one
// TokenReview.
func TestAuthReviewsPerIndexNotPerKey(t *testing.T) {
	testenv.Need(t, env)
	reader, _, nobody := authtest.Identities(t, env)
	kube, c := authtest.CountingKube(t, env.Config)
	srv := guarded(t, kube, quietLog())
	want := func(step string, tokenReviews, accessReviews int64) {
		t.Helper()
		if c.TokenReviews.Load() != tokenReviews || c.AccessReviews.Load() != accessReviews {
			t.Fatalf("%s: %s, want %d and %d", step, c.Counts(), tokenReviews, accessReviews)
		}
	}
	get := func(path, token string, code int) {
		t.Helper()
		if got, body := getWith(t, http.DefaultClient, srv.URL+path, token); got != code {
			t.Fatalf("GET %s = %d %s, want %d", path, got, body, code)
		}
	}

	for i := range 50 {
		get(fmt.Sprintf("/v1/indexes/model-to-app/keys/key-%d", i), reader, 200)
	}
	want("50 keys of one index", 1, 1)
	get("/v1/indexes/model-to-app/keys", reader, 200)
	get("/v1/indexes/model-to-app/keys/a%2Fb", reader, 200)
	want("the key list of the same index", 1, 1)
	for i := range 10 {
		get(fmt.Sprintf("/v1/chains/model-to-addresses/keys/key-%d", i), reader, 200)
		get(fmt.Sprintf("/v1/indexes/service-to-addresses/keys/key-%d", i), reader, 200)
	}
	want("10 keys of a chain and of another index", 1, 3)
	get("/v1/indexes", reader, 200)
	get("/metrics", reader, 200)
	want("the index list and /metrics", 1, 5)

	// Another token of the same account, 20 requests at once: one
	// TokenReview, one SubjectAccessReview (a ServiceAccount token's
	// identity carries its credential ID in extra, which the access review
	// passes on: a new token is a new identity).
	second := authtest.Token(t, env, "reader")
	var wg gosync.WaitGroup
	for i := range 20 {
		wg.Go(func() { get(fmt.Sprintf("/v1/indexes/model-to-app/keys/again-%d", i), second, 200) })
	}
	wg.Wait()
	want("a second token of the same account, 20 requests at once", 2, 6)

	get("/v1/indexes/model-to-app/keys/x", "made-up", 401)
	get("/v1/indexes/model-to-app/keys/y", "made-up", 401)
	want("a bad token twice", 3, 6)
	get("/v1/indexes/model-to-app/keys/x", nobody, 403)
	get("/v1/indexes/model-to-app/keys/y", nobody, 403)
	want("a token without access, twice", 4, 7)
}

// TestAuthSD: the /v1/sd answers are read with the access of their chain
// or index, behind TokenReview as every lookup is: a token with access
// gets the target groups, one without 403, none 401.
func TestAuthSD(t *testing.T) {
	testenv.Need(t, env)
	reader, _, nobody := authtest.Identities(t, env)
	srv := httptest.NewServer(newGuard(t, env.Config, quietLog()).Wrap(fedServer(t, map[string][]string{"base": {"model1"}})))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		path, token string
		code        int
	}{
		{"/v1/sd/chains/model-to-addresses", reader, 200},
		{"/v1/sd/indexes/service-to-addresses", reader, 200},
		{"/v1/sd/chains/model-to-addresses", nobody, 403},
		{"/v1/sd/indexes/service-to-addresses", "", 401},
		{"/v1/sd/indexes/service-to-addresses", "made-up", 401},
	} {
		if got, body := getWith(t, http.DefaultClient, srv.URL+c.path, c.token); got != c.code {
			t.Errorf("GET %s with token %.8q: %d %s, want %d", c.path, c.token, got, body, c.code)
		}
	}
}

// TestAuthFailedReviewNotCached: when a review fails (the apiserver cannot
// be reached), that request gets 503 and nothing is remembered: the next
// request with the same token succeeds as soon as the apiserver answers.
func TestAuthFailedReviewNotCached(t *testing.T) {
	testenv.Need(t, env)
	reader, _, _ := authtest.Identities(t, env)

	// An apiserver address where nothing listens yet. The port is free
	// when it is picked; another process may take it before the proxy
	// does: then again, on another port.
	var (
		c     *authtest.ReviewCounter
		srv   *httptest.Server
		url   string
		proxy *testenv.Proxy
	)
	for attempt := 1; proxy == nil; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		cfg := rest.CopyConfig(env.Config)
		cfg.Host = "https://" + addr
		var kube *rest.Config
		kube, c = authtest.CountingKube(t, cfg)
		srv = guarded(t, kube, quietLog())
		url = srv.URL + "/v1/indexes/model-to-app/keys/model1"
		if code, body := getWith(t, http.DefaultClient, url, reader); code != 503 {
			t.Fatalf("apiserver unreachable: %d %s, want 503", code, body)
		}
		proxy, err = testenv.NewProxy(addr, env.APIServerAddr())
		if err != nil && (attempt == 5 || !errors.Is(err, syscall.EADDRINUSE)) {
			t.Fatal(err)
		}
	}
	defer proxy.Close()
	if code, body := getWith(t, http.DefaultClient, url, reader); code != 200 {
		t.Fatalf("the apiserver is back, the same token: %d %s, want 200", code, body)
	}

	// A SubjectAccessReview that fails once.
	c.FailAccess.Store(1)
	chain := srv.URL + "/v1/chains/model-to-addresses/keys/model1"
	if code, body := getWith(t, http.DefaultClient, chain, reader); code != 503 {
		t.Fatalf("access review failing: %d %s, want 503", code, body)
	}
	if code, body := getWith(t, http.DefaultClient, chain, reader); code != 200 {
		t.Fatalf("access review back: %d %s, want 200", code, body)
	}

	// A TokenReview that fails once, for a token not seen yet.
	second := authtest.Token(t, env, "reader")
	c.FailTokens.Store(1)
	if code, body := getWith(t, http.DefaultClient, url, second); code != 503 {
		t.Fatalf("token review failing: %d %s, want 503", code, body)
	}
	if code, body := getWith(t, http.DefaultClient, url, second); code != 200 {
		t.Fatalf("token review back: %d %s, want 200", code, body)
	}
}

// warnCounter is a slog handler counting warnings and errors.
type warnCounter struct{ n atomic.Int64 }

func (h *warnCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *warnCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h *warnCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *warnCounter) WithGroup(string) slog.Handler      { return h }

// TestAuthFloodKeepsKnownCallers: 64 goroutines send made-up tokens
// (25,000 requests, well beyond any cache bound) while an authorized
// caller, whose verdict is cached, keeps asking: it gets 200 every time,
// never 503; the flood gets 401 or 503, and the log a handful of lines.
// The review client has client-go's default limits (5 QPS), as the daemon's
// had when this was reported: the guard must hold whatever they are. The
// requests go to the guard's handler directly, without HTTP, to be many.
func TestAuthFloodKeepsKnownCallers(t *testing.T) {
	testenv.Need(t, env)
	reader, _, _ := authtest.Identities(t, env)
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 5, 10
	kube, c := authtest.CountingKube(t, cfg)
	warns := &warnCounter{}
	h := newGuard(t, kube, slog.New(warns)).Wrap(offlineServer(t))
	serve := func(token string) int {
		req := httptest.NewRequest("GET", "/v1/indexes/model-to-app/keys/model1", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := serve(reader); code != 200 {
		t.Fatalf("the reader before the flood: %d", code)
	}

	const flood = 25000
	var sent atomic.Int64
	var codes gosync.Map // status code → *atomic.Int64
	done := make(chan struct{})
	var wg gosync.WaitGroup
	for range 64 {
		wg.Go(func() {
			b := make([]byte, 16)
			for sent.Add(1) <= flood {
				_, _ = rand.Read(b)
				n, _ := codes.LoadOrStore(serve(hex.EncodeToString(b)), &atomic.Int64{})
				n.(*atomic.Int64).Add(1)
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	var asked int
	bad := map[int]int{}
	for stop := false; !stop; {
		select {
		case <-done:
			stop = true
		default:
		}
		asked++
		if code := serve(reader); code != 200 {
			bad[code]++
		}
	}
	summary := fmt.Sprintf("flood answers %s; the reader asked %d times; %s; %d warnings", codeCounts(&codes), asked, c.Counts(), warns.n.Load())
	t.Log(summary)
	if len(bad) > 0 {
		t.Fatalf("the authorized caller got %v in %d requests during the flood (%s)", bad, asked, summary)
	}
	codes.Range(func(k, _ any) bool {
		if k.(int) != 401 && k.(int) != 503 {
			t.Errorf("a made-up token got %d (%s)", k, summary)
		}
		return true
	})
	if warns.n.Load() > 20 {
		t.Errorf("%d warnings logged for one flood", warns.n.Load())
	}
}

func codeCounts(m *gosync.Map) string {
	var parts []string
	m.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%d×%d", v.(*atomic.Int64).Load(), k))
		return true
	})
	return strings.Join(parts, " ")
}

// TestAuthStreamEndsWhenAccessGoes: a change stream is authorized again as
// it goes: when its caller loses access, the stream ends, and the
// reconnect gets 403.
func TestAuthStreamEndsWhenAccessGoes(t *testing.T) {
	testenv.Need(t, env)
	ctx := context.Background()
	env.Namespace(t, authtest.NS)
	const sa, name = "streamer", "metasync-api-test-streamer"
	if _, err := env.Kube.CoreV1().ServiceAccounts(authtest.NS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.Kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/v1/*"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: authtest.NS}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	token := authtest.Token(t, env, sa)
	s := offlineServer(t)
	s.SetHeartbeat(100 * time.Millisecond)
	guard := newGuard(t, env.Config, quietLog())
	guard.SetLifetimes(auth.Lifetimes{Positive: 500 * time.Millisecond})
	srv := httptest.NewServer(guard.Wrap(s))
	defer srv.Close()
	target := srv.URL + "/v1/indexes/model-to-app/keys/m?watch=true"
	var resp *http.Response
	testenv.Eventually(t, "the stream opens (RBAC has seen the binding)", func() string {
		req, _ := http.NewRequest("GET", target, nil)
		req.Header.Set("Authorization", "Bearer "+token)
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
		t.Fatal("the stream ended while its caller had access")
	case <-time.After(time.Second):
	}
	if err := env.Kube.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the stream outlived its caller's access by 30s")
	}
	if code, body := getWith(t, http.DefaultClient, target, token); code != http.StatusForbidden {
		t.Fatalf("reconnect: %d %s, want 403", code, body)
	}
}
