package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/iidp/metasync/internal/wire"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/authtest"
	"github.com/iidp/metasync/test/testenv"
)

// startedOffline is the offline API with its engine running against an
// apiserver that is not there (127.0.0.1:1): no resource gets ready, and
// the reasons name that address, as they would name a real apiserver,
// namespaces, selectors and RBAC errors.
func startedOffline(t *testing.T) *Server {
	t.Helper()
	s := offlineServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.engine.(*msync.Inspector).Start(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	testenv.Eventually(t, "the reasons name the apiserver", func() string {
		for _, st := range s.engine.Status() {
			if !strings.Contains(st.Reason, "127.0.0.1:1") {
				return st.Name + ": " + st.Reason
			}
		}
		return ""
	})
	return s
}

type readyAnswer struct {
	Status    string                `json:"status"`
	Reasons   []string              `json:"reasons"`
	Resources []wire.ResourceHealth `json:"resources"`
	Verbose   string                `json:"verbose"`
}

func readyz(t *testing.T, h http.Handler, target, token string) (int, readyAnswer, string) {
	t.Helper()
	req := httptest.NewRequest("GET", target, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var a readyAnswer
	if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
		t.Fatalf("GET %s: %v: %s", target, err, rec.Body)
	}
	return rec.Code, a, rec.Body.String()
}

// shortForm checks an answer of /readyz without details: 503, the
// resources named with a generic word, nothing of the reasons.
func shortForm(t *testing.T, what string, code int, a readyAnswer, raw string) {
	t.Helper()
	want := []string{"appmodels: not synced", "endpointslices: not synced"}
	if code != 503 || a.Status != "not ready" || !slices.Equal(a.Reasons, want) || a.Resources != nil {
		t.Fatalf("%s: %d %s, want 503 with reasons %q and no resources", what, code, raw, want)
	}
	for _, secret := range []string{"127.0.0.1", "refused", "meta-test", "iidp"} {
		if strings.Contains(raw, secret) {
			t.Fatalf("%s: the short form tells %q: %s", what, secret, raw)
		}
	}
}

// TestReadyzShortFormHidesReasons: /readyz names the resources that are
// not ready and nothing of why; ?verbose (no guard here) gives the reasons
// and every resource; the status code is the same either way.
func TestReadyzShortFormHidesReasons(t *testing.T) {
	s := startedOffline(t)
	code, a, raw := readyz(t, s, "/readyz", "")
	shortForm(t, "/readyz", code, a, raw)

	code, a, raw = readyz(t, s, "/readyz?verbose", "")
	if code != 503 || len(a.Resources) != 2 || len(a.Reasons) != 2 || !strings.Contains(a.Reasons[0], "127.0.0.1:1") || a.Verbose != "" {
		t.Fatalf("/readyz?verbose = %d %s, want 503 with the reasons and the resources", code, raw)
	}

	s.SetStopping()
	code, a, raw = readyz(t, s, "/readyz", "")
	if code != 503 || len(a.Reasons) == 0 || a.Reasons[0] != "shutting down" || strings.Contains(raw, "127.0.0.1") {
		t.Fatalf("/readyz while stopping = %d %s", code, raw)
	}
}

// TestReadyzVerboseNeedsAccess: behind TokenAuth, /readyz stays open, and
// ?verbose gives the details only to a token allowed to get
// /readyz/verbose; any other caller gets the short form, with the same
// status code, and "verbose" saying why. Access to the data (/v1/*) is not
// enough, nor is Kubernetes' default grant of /readyz to everyone.
func TestReadyzVerboseNeedsAccess(t *testing.T) {
	testenv.Need(t, env)
	reader, operator, nobody := authtest.Identities(t, env)
	kube, _ := authtest.CountingKube(t, env.Config)
	h := newGuard(t, kube, quietLog()).Wrap(startedOffline(t))

	code, a, raw := readyz(t, h, "/readyz", "")
	shortForm(t, "/readyz without a token", code, a, raw)
	for _, c := range []struct{ who, token, why string }{
		{"no token", "", "a bearer token is required"},
		{"a made-up token", "made-up", "the token is not valid"},
		{"a token without access", nobody, "may not get /readyz/verbose"},
		{"a token with access to /v1/*", reader, "may not get /readyz/verbose"},
	} {
		code, a, raw := readyz(t, h, "/readyz?verbose", c.token)
		shortForm(t, "/readyz?verbose with "+c.who, code, a, raw)
		if !strings.Contains(a.Verbose, c.why) {
			t.Fatalf("/readyz?verbose with %s: %q does not say %q", c.who, a.Verbose, c.why)
		}
	}
	code, a, raw = readyz(t, h, "/readyz?verbose", operator)
	if code != 503 || len(a.Resources) != 2 || len(a.Reasons) != 2 || !strings.Contains(a.Reasons[0], "127.0.0.1:1") || a.Verbose != "" {
		t.Fatalf("/readyz?verbose with a token allowed /readyz/*: %d %s, want the details", code, raw)
	}
}
