package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/metasynctest"
	msync "github.com/iidp/metasync/sync"
)

// TestGetExplain: `metasync get --explain` prints where an answer comes
// from as a tree, over the real HTTP API: a chain's steps, both claimants
// of a key in conflict with the chosen one marked, and why a step found
// nothing; bad combinations of flags are refused.
func TestGetExplain(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	fake, err := metasynctest.New(appmodelsPlan(t))
	if err != nil {
		t.Fatal(err)
	}
	e, f := fake.Engine(), fake.Feed()
	app := func(name, created string, models ...string) []byte {
		b, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"name": name, "namespace": "meta-test", "labels": map[string]string{"iidp": "iidp"},
				"creationTimestamp": created, "resourceVersion": "7" + name[:1]},
			"spec": map[string]any{"models": models},
		})
		return b
	}
	if err := f.Replace("appmodels", app("young", "2026-01-02T00:00:00Z", "model1"), app("old", "2025-01-02T00:00:00Z", "model1")); err != nil {
		t.Fatal(err)
	}
	slice := `{"metadata":{"name":"old-a","namespace":"meta-test","resourceVersion":"90","labels":{"kubernetes.io/service-name":"old"}},"endpoints":[{"addresses":["10.0.0.5"]}]}`
	if err := f.Replace("endpointslices", []byte(slice)); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(server.New(e.Inspect(), quiet))
	defer srv.Close()

	out, errOut, code := cli("get", "--server", srv.URL, "--explain", "--chain", "model-to-addresses", "model1")
	want := `chain model-to-addresses model1 → 10.0.0.5
├─ model-to-app: model1 → old
│     conflict on model1: claimed by several objects, the oldest answered
│  ├─ appmodels meta-test/old (resourceVersion 7o, created 2025-01-02T00:00:00Z): model1 → old  [chosen: oldest]
│  └─ appmodels meta-test/young (resourceVersion 7y, created 2026-01-02T00:00:00Z): model1 → young  [not answered: younger claimant]
└─ service-to-addresses: old → 10.0.0.5
   └─ endpointslices meta-test/old-a (resourceVersion 90): old → 10.0.0.5
`
	if code != 0 || out != want {
		t.Fatalf("get --explain = exit %d\n%s\nstderr %s\nwant\n%s", code, out, errOut, want)
	}
	out, _, code = cli("get", "--server", srv.URL, "--explain", "model-to-app", "nobody")
	if code != 0 || !strings.Contains(out, "model-to-app: nobody → nothing ("+msync.ExplainUnknownKey+")") {
		t.Fatalf("get --explain of an unknown key: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{
		{"--explain", "--watch", "model-to-app", "model1"},
		{"--explain", "model-to-app"},
		{"--explain", "--limit", "5", "model-to-app", "model1"},
		{"--explain", "--objects", "model-to-app", "model1"},
	} {
		if _, errOut, code := cli(append([]string{"get", "--server", srv.URL}, args...)...); code != 2 || !strings.Contains(errOut, "--explain explains one answer") {
			t.Errorf("get %v: exit %d, %s", args, code, errOut)
		}
	}
	// A flood of explanations is refused, at once, with Retry-After.
	refused := 0
	for range server.ExplainBurstPerCaller + 5 {
		resp, err := srv.Client().Get(srv.URL + "/v1/indexes/model-to-app/keys/model1?explain=true")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 429 {
			refused++
			if resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(b), "explanations a second") {
				t.Errorf("429 %s, Retry-After %q", b, resp.Header.Get("Retry-After"))
			}
		}
	}
	if refused == 0 {
		t.Errorf("%d explanations at once: none refused", server.ExplainBurstPerCaller+5)
	}
	// Over HTTP: explain with watch, or a bad value, is a 400 naming it.
	for path, wantErr := range map[string]string{
		"/v1/indexes/model-to-app/keys/model1?explain=yes":                `explain=\"yes\"`,
		"/v1/indexes/model-to-app/keys/model1?explain=true&watch=true":    "explain=true and watch=true",
		"/v1/indexes/model-to-app/keys/model1?explain=false&explain=true": "explain given more than once",
		"/v1/indexes/model-to-app/keys/model1?explain":                    `explain=\"\"`,
	} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), wantErr) {
			t.Errorf("GET %s = %d %s", path, resp.StatusCode, b)
		}
	}
}

// TestGetExplainOddAnswers: a daemon that answers without steps (one that
// does not explain) is an error, not an answer with nothing behind it; keys
// and values that would break the tree's lines are quoted.
func TestGetExplainOddAnswers(t *testing.T) {
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"index":"model-to-app","key":"model1","values":["old"]}`)
	}))
	defer old.Close()
	if out, errOut, code := cli("get", "--server", old.URL, "--explain", "model-to-app", "model1"); code != 1 || out != "" || !strings.Contains(errOut, "without steps") {
		t.Errorf("a daemon that does not explain: exit %d %q %q", code, out, errOut)
	}
	forged := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"index":"ix","key":"a\n└─ forged","values":["v,w"],"steps":[{"index":"ix","keys":["a\n└─ forged"],"values":["v,w"],"synced":true,
"objects":[{"resource":"r","key":"ns/\u001b[31mred","resourceVersion":"1","indexKey":"a\n└─ forged","values":["v,w"]}]}]}`)
	}))
	defer forged.Close()
	out, errOut, code := cli("get", "--server", forged.URL, "--explain", "ix", "a")
	want := `ix "a\n└─ forged" → "v,w"
└─ ix: "a\n└─ forged" → "v,w"
   └─ r "ns/\x1b[31mred" (resourceVersion 1): "a\n└─ forged" → "v,w"
`
	if code != 0 || out != want {
		t.Errorf("odd keys: exit %d %s\n%s\nwant\n%s", code, errOut, out, want)
	}
}
