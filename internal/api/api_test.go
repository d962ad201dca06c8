package api

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// offlineServer is the API over an engine that was never started: empty
// indexes, no cluster.
func offlineServer(t testing.TB) *Server {
	t.Helper()
	plan, err := schema.LoadPlan("../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := msync.New(plan, &rest.Config{Host: "https://127.0.0.1:1"}, msync.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return New(e, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func TestOfflineAnswers(t *testing.T) {
	s := offlineServer(t)
	for _, c := range []struct {
		method, target string
		code           int
		body           string
	}{
		{"GET", "/v1/indexes/model-to-app/keys/a%2Fb", 200, `{"index":"model-to-app","key":"a/b","values":[]}`},
		{"GET", "/v1/indexes/model-to-app/keys/a/b", 200, `{"index":"model-to-app","key":"a/b","values":[]}`},
		{"GET", "/v1/indexes/model-to-app/keys", 200, `{"index":"model-to-app","keys":[]}`},
		{"GET", "/readyz", 503, ""},
		{"GET", "/livez", 200, `{"status":"ok"}`},
		{"DELETE", "/livez", 405, `{"error":"method DELETE not allowed; use GET"}`},
		{"GET", "/v1/chains/x/keys/y", 404, `{"error":"unknown chain \"x\""}`},
	} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(c.method, c.target, nil))
		if rec.Code != c.code || (c.body != "" && strings.TrimSpace(rec.Body.String()) != c.body) {
			t.Errorf("%s %s = %d %s", c.method, c.target, rec.Code, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", c.method, c.target, ct)
		}
	}
}

// FuzzHTTP: any method, path and query gets an answer, JSON unless it is
// /metrics or a redirect; never a panic.
func FuzzHTTP(f *testing.F) {
	f.Add("GET", "/v1/indexes/model-to-app/keys/model1", "")
	f.Add("GET", "/v1/indexes/model-to-app/keys", "limit=1&continue=m")
	f.Add("POST", "/v1/chains/model-to-addresses/keys/a%2Fb", "")
	f.Add("GET", "/readyz", "verbose")
	f.Add("GET", "/v1/indexes/%zz/keys", "limit=-1")
	f.Add("GET", "/../../v1//indexes", "")
	s := offlineServer(f)
	f.Fuzz(func(t *testing.T, method, path, query string) {
		if method == "" || strings.ContainsAny(method, " \t\r\n") {
			return
		}
		u := &url.URL{Path: path, RawQuery: query}
		if p, err := url.PathUnescape(path); err == nil {
			u.Path, u.RawPath = p, path
		}
		req := &http.Request{Method: method, URL: u, Header: http.Header{}, Body: http.NoBody, Host: "x"}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %q %q: %d %s", method, path, query, rec.Code, rec.Body)
		}
		if rec.Code/100 == 3 || strings.HasPrefix(u.Path, "/metrics") {
			return
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %q: Content-Type %q", method, path, ct)
		}
		if !json.Valid(rec.Body.Bytes()) && method != http.MethodHead {
			t.Fatalf("%s %q: not JSON: %q", method, path, rec.Body)
		}
	})
}
