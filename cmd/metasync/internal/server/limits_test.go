package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/authtest"
	"github.com/iidp/metasync/test/testenv"
)

// refusal checks a refusal at a limit: the status, the API's JSON error
// and a Retry-After.
func refusal(t *testing.T, what string, resp *http.Response, code int) {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body map[string]string
	if resp.StatusCode != code || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(b, &body) != nil || body["error"] == "" {
		t.Fatalf("%s: %d %q %s, want %d with a JSON error", what, resp.StatusCode, resp.Header.Get("Content-Type"), b, code)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Fatalf("%s: %d without Retry-After", what, code)
	}
}

// streamAccount creates a ServiceAccount that may get /v1/*.
func streamAccount(t *testing.T, sa string) {
	t.Helper()
	ctx := context.Background()
	env.Namespace(t, authtest.NS)
	name := "metasync-api-test-" + sa
	if _, err := env.Kube.CoreV1().ServiceAccounts(authtest.NS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.Kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/v1/*", "/metrics"}, Verbs: []string{"get"}}},
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
}

// podToken returns a token of ServiceAccount sa bound to a pod of its
// own, made for the purpose (no kubelet runs it), as a projected token
// is: its TokenReview names the pod.
func podToken(t *testing.T, sa, pod string) string {
	t.Helper()
	ctx := context.Background()
	p, err := env.Kube.CoreV1().Pods(authtest.NS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod},
		Spec: corev1.PodSpec{ServiceAccountName: sa, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "c", Image: "none"}}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		p, err = env.Kube.CoreV1().Pods(authtest.NS).Get(ctx, pod, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	tr, err := env.Kube.CoreV1().ServiceAccounts(authtest.NS).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// TestStreamLimitsPerIdentity: behind TokenAuth the per-caller limit
// counts the streams of one identity, whatever its tokens and address:
// two tokens of one ServiceAccount share a limit of 2 (the third stream
// gets 429); tokens of that account bound to two pods, as projected
// tokens are, are two callers more; another account from the same address
// has its own limit; the global limit of 5 answers 503. Lookups answer
// meanwhile, and /metrics counts each refusal by reason.
func TestStreamLimitsPerIdentity(t *testing.T) {
	testenv.Need(t, env)
	streamAccount(t, "limited-a")
	streamAccount(t, "limited-b")
	a1, a2, b := authtest.Token(t, env, "limited-a"), authtest.Token(t, env, "limited-a"), authtest.Token(t, env, "limited-b")
	pod1, pod2 := podToken(t, "limited-a", "limited-a-1"), podToken(t, "limited-a", "limited-a-2")
	s := fedServer(t, map[string][]string{"base": {"model1"}})
	s.SetLimits(Limits{Streams: 5, StreamsPerCaller: 2})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.HTTPServer(ln.Addr().String(), quietLog(), newGuard(t, env.Config, quietLog()))
	go func() { _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	base := "http://" + ln.Addr().String()
	target := base + "/v1/indexes/model-to-app/keys/model1?watch=true"
	client := &http.Client{Transport: &http.Transport{}}
	get := func(url, token string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	open := func(what, token string) {
		t.Helper()
		var resp *http.Response
		// RBAC's informers take a moment to see a new binding.
		testenv.Eventually(t, what+" opens", func() string {
			resp = get(target, token)
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return fmt.Sprintf("%d %s", resp.StatusCode, b)
			}
			return ""
		})
		t.Cleanup(func() { resp.Body.Close() })
	}
	open("a's first stream", a1)
	open("a's second stream, with another token", a2)
	refusal(t, "a's third stream", get(target, a1), http.StatusTooManyRequests)
	open("a stream of a's first pod", pod1)
	open("a stream of a's second pod", pod2)
	open("b's first stream, from the same address", b)
	refusal(t, "b's second stream, beyond the global limit", get(target, b), http.StatusServiceUnavailable)

	for _, path := range []string{"/v1/indexes/model-to-app/keys/model1", "/v1/indexes", "/livez", "/readyz"} {
		resp := get(base+path, b)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s while streams are refused: %d %s", path, resp.StatusCode, body)
		}
	}
	for reason, want := range map[string]float64{refusedPerCaller: 1, refusedStreams: 1, refusedConnections: 0} {
		if got := testutil.ToFloat64(s.limitMetrics.refused.WithLabelValues(reason)); got != want {
			t.Errorf("metasync_http_refused_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}

// limitedServer serves examples/appmodel's config over an engine without a
// cluster, as serve does with limits: HTTPServer on the limited Listener.
func limitedServer(t testing.TB, l Limits) (base string, f *msync.Feed, s *Server) {
	t.Helper()
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	e, f := fake.Engine(), fake.Feed()
	s = New(e.Inspect(), quiet)
	s.SetHeartbeat(time.Hour)
	s.SetLimits(l)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.HTTPServer(ln.Addr().String(), quiet, nil)
	go func() { _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), f, s
}

// rawGet sends a GET on a connection of its own and returns the response,
// its body read.
func rawGet(t *testing.T, addr, path string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestConnectionLimit: at the connection limit a new connection takes the
// place of one with no request yet (which is closed), so that a probe
// answers after a flood of idle connections; when every connection holds
// a stream, a new one is answered 503 with a JSON error and Retry-After,
// counted, and the place is free again once a stream ends.
func TestConnectionLimit(t *testing.T) {
	const limit = 4
	base, f, s := limitedServer(t, Limits{Connections: limit})
	addr := strings.TrimPrefix(base, "http://")
	if err := f.Apply("appmodels", appModel("a", "m1")); err != nil {
		t.Fatal(err)
	}
	var streams []*frames
	for range limit - 1 {
		fs := watch(t, base+"/v1/indexes/model-to-app/keys/m1?watch=true")
		if got := show(fs.next(t)); got != "snapshot m1 [a]" {
			t.Fatal(got)
		}
		streams = append(streams, fs)
	}

	// A flood of connections that send nothing, ten times the room left.
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 10 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	// Each probe's connection closes once answered: wait for it, so that
	// the next one finds the place of an idle connection, not a busy one.
	closed := func() {
		t.Helper()
		testenv.Eventually(t, "the probe's connection closed", func() string {
			if n := s.connLimiter().openCount(); n > limit-1 {
				return fmt.Sprintf("%d open", n)
			}
			return ""
		})
	}
	for _, path := range []string{"/livez", "/readyz", "/v1/indexes/model-to-app/keys/m1"} {
		if resp, body := rawGet(t, addr, path); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s after a flood of idle connections: %d %s", path, resp.StatusCode, body)
		}
		closed()
	}
	if n := testutil.ToFloat64(s.limitMetrics.evicted); n < 10 {
		t.Errorf("%v idle connections closed to make room, want at least 10", n)
	}

	// Every place holds a stream: the next connection is refused.
	last := watch(t, base+"/v1/indexes/model-to-app/keys/m1?watch=true")
	if got := show(last.next(t)); got != "snapshot m1 [a]" {
		t.Fatal(got)
	}
	resp, body := rawGet(t, addr, "/livez")
	refusal(t, "a connection beyond the limit, every one busy", &http.Response{StatusCode: resp.StatusCode, Header: resp.Header, Body: io.NopCloser(strings.NewReader(body))}, http.StatusServiceUnavailable)
	if n := testutil.ToFloat64(s.limitMetrics.refused.WithLabelValues(refusedConnections)); n != 1 {
		t.Errorf("metasync_http_refused_total{reason=connections} = %v, want 1", n)
	}

	last.resp.Body.Close()
	testenv.Eventually(t, "a probe once a stream ended", func() string {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err.Error()
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return resp.Status
		}
		return ""
	})
	for _, fs := range streams {
		fs.resp.Body.Close()
	}
}
