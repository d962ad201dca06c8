package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/metasynctest"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/wire"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// offlineServer is the API over an engine that was never started: empty
// indexes, no cluster.
func offlineServer(t testing.TB) *Server {
	t.Helper()
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := msync.New(plan, &rest.Config{Host: "https://127.0.0.1:1"}, msync.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return New(e.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// fedServer serves an engine without a cluster, synced, holding one
// AppModel of examples/appmodel's config per entry of apps (name to models).
func fedServer(t testing.TB, apps map[string][]string) *Server {
	t.Helper()
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	e, f := fake.Engine(), fake.Feed()
	for name, models := range apps {
		b, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"name": name, "namespace": "meta-test", "labels": map[string]string{"iidp": "iidp"}},
			"spec":     map[string]any{"models": models},
		})
		if err := f.Apply("appmodels", b); err != nil {
			t.Fatal(err)
		}
	}
	return New(e.Inspect(), quiet)
}

func TestOfflineAnswers(t *testing.T) {
	s := offlineServer(t)
	for _, c := range []struct {
		method, target string
		code           int
		body           string
	}{
		// Never synced: "don't know yet", not "no values".
		{"GET", "/v1/indexes/model-to-app/keys/a%2Fb", 200, `{"index":"model-to-app","key":"a/b","values":[],"synced":false}`},
		{"GET", "/v1/indexes/model-to-app/keys/a/b", 200, `{"index":"model-to-app","key":"a/b","values":[],"synced":false}`},
		{"GET", "/v1/indexes/model-to-app/keys", 200, `{"index":"model-to-app","keys":[],"synced":false}`},
		{"GET", "/v1/chains/model-to-addresses/keys/m", 200, `{"chain":"model-to-addresses","key":"m","values":[],"synced":false}`},
		{"GET", "/readyz", 503, ""},
		{"GET", "/livez", 200, `{"status":"ok"}`},
		{"DELETE", "/livez", 405, `{"error":"method DELETE not allowed; use GET"}`},
		{"GET", "/v1/chains/x/keys/y", 404, `{"error":"unknown chain \"x\" (known: model-to-addresses, model-to-endpoints)"}`},
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
	f.Add("GET", "/v1/indexes/model-to-app/keys/model1", "watch=true&version=x")
	f.Add("GET", "/v1/chains/model-to-addresses/keys/m", "watch=true")
	s := offlineServer(f)
	f.Fuzz(func(t *testing.T, method, path, query string) {
		if method == "" || strings.ContainsAny(method, " \t\r\n") {
			return
		}
		u := &url.URL{Path: path, RawQuery: query}
		if p, err := url.PathUnescape(path); err == nil {
			u.Path, u.RawPath = p, path
		}
		// A stream (?watch=true) lasts until its request's context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		req := (&http.Request{Method: method, URL: u, Header: http.Header{}, Body: http.NoBody, Host: "x"}).WithContext(ctx)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Header().Get("Content-Type") == "application/x-ndjson" {
			for _, line := range bytes.Split(bytes.TrimSpace(rec.Body.Bytes()), []byte("\n")) {
				if len(line) > 0 && !json.Valid(line) {
					t.Fatalf("%s %q %q: a frame that is not JSON: %q", method, path, query, line)
				}
			}
			return
		}
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

// TestKeysPagingReachesTheEnd: paging with any limit lists every key once,
// the empty key included wherever it falls (a page that ended with "" used
// to drop its continue, and an empty continue means "from the start").
func TestKeysPagingReachesTheEnd(t *testing.T) {
	want := []string{"", "a", "b", "c/d", "é"}
	s := fedServer(t, map[string][]string{"x": want})
	for limit := 1; limit <= len(want)+1; limit++ {
		var got []string
		next := ""
		for page := 0; ; page++ {
			if page > len(want)+1 {
				t.Fatalf("limit=%d: paging does not end", limit)
			}
			target := "/v1/indexes/model-to-app/keys?limit=" + strconv.Itoa(limit)
			if next != "" {
				target += "&continue=" + url.QueryEscape(next)
			}
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
			var ans wire.Keys
			if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &ans) != nil {
				t.Fatalf("GET %s = %d %s", target, rec.Code, rec.Body)
			}
			got = append(got, *ans.Keys...)
			if ans.Continue == "" {
				break
			}
			next = ans.Continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("limit=%d: paged keys %q, want %q", limit, got, want)
		}
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/indexes/model-to-app/keys?continue=zzz", nil))
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "continue") {
		t.Errorf("a continue that is no token: %d %s, want 400 naming continue", rec.Code, rec.Body)
	}
}

// TestUnknownNamesListTheKnown: a 404 for an unknown index or chain names
// the ones the config declares.
func TestUnknownNamesListTheKnown(t *testing.T) {
	s := offlineServer(t)
	for target, want := range map[string]string{
		"/v1/indexes/model-to-ap/keys/x":  "model-to-app",
		"/v1/indexes/model-to-ap/keys":    "model-to-app",
		"/v1/chains/model-to-addr/keys/x": "model-to-addresses",
	} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
		if rec.Code != 404 || !strings.Contains(rec.Body.String(), "known: ") || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s = %d %s, want 404 naming %s", target, rec.Code, rec.Body, want)
		}
	}
}
