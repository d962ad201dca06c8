package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/metasynctest"
)

// TestGetObjects: `get --resource` prints an object's fields and `get
// --objects` the objects behind a key, one JSON line each; flags may follow
// the arguments; --server takes HOST:PORT.
func TestGetObjects(t *testing.T) {
	srv := apiServer(t, []string{"model1", "model1"})
	hostPort := strings.TrimPrefix(srv.URL, "http://")
	for _, c := range []struct {
		args   []string
		out    string
		stderr string // a note
	}{
		{[]string{"get", "--server", srv.URL, "--resource", "appmodels", "meta-test/app-a"},
			`{"key":"meta-test/app-a","fields":{"models":["model1"],"name":"app-a","type":"model","version":"1"}}` + "\n", ""},
		{[]string{"get", "--resource", "appmodels", "meta-test/app-a", "--server", hostPort},
			`{"key":"meta-test/app-a","fields":{"models":["model1"],"name":"app-a","type":"model","version":"1"}}` + "\n", ""},
		// model-to-app is unique: app-a and app-b claim model1 (neither
		// has a creation time: by object key), app-a answers, and its
		// object is the one behind the key.
		{[]string{"get", "--objects", "model-to-app", "model1", "--server", srv.URL},
			`{"key":"meta-test/app-a","fields":{"models":["model1"],"name":"app-a","type":"model","version":"1"}}` + "\n", ""},
		{[]string{"get", "--objects", "model-to-app", "nobody", "--server", srv.URL}, "", ""},
		{[]string{"get", "model-to-app", "model1", "--server", hostPort}, "app-a\n",
			"metasync: note: conflict: several objects claim model1 in the unique index model-to-app, with different values; the oldest's is answered (metasync get --explain model-to-app model1 names them)\n"},
		{[]string{"get", "model-to-app", "--server", srv.URL + "/"}, "model1\n", ""},
	} {
		out, errOut, code := cli(c.args...)
		if code != 0 || out != c.out || errOut != c.stderr {
			t.Errorf("%q = exit %d\n%s%s\nwant\n%s", c.args, code, out, errOut, c.out)
		}
	}
	for _, c := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"get", "--server", srv.URL, "--resource", "appmodels", "meta-test/nope"}, 1, `has no object "meta-test/nope"`},
		{[]string{"get", "--server", srv.URL, "--resource", "nope", "x"}, 1, `unknown resource "nope"`},
		{[]string{"get", "--server", srv.URL, "--objects", "model-to-app"}, 2, "usage: metasync get"},
		{[]string{"get", "--server", srv.URL, "--objects", "--watch", "model-to-app", "model1"}, 2, "not with --watch"},
		{[]string{"get", "--server", "ftp://x", "model-to-app"}, 2, "want http://HOST:PORT"},
		{[]string{"get", "--server", srv.URL, "--watch", "--limit", "3", "model-to-app", "model1"}, 2, "--limit pages the keys of an index"},
		{[]string{"get", "--server", srv.URL, "--limit", "3", "model-to-app", "model1"}, 2, "--limit pages the keys of an index"},
	} {
		out, errOut, code := cli(c.args...)
		if code != c.code || out != "" || !strings.Contains(errOut, c.stderr) {
			t.Errorf("%q = exit %d %q %q, want exit %d and %s", c.args, code, out, errOut, c.code, c.stderr)
		}
	}
}

// TestGetObjectsOfAnyKey: --objects reaches the objects of every key,
// "/" included (ServeMux routes its escaped form elsewhere), and flags may
// take "--" as their value.
func TestGetObjectsOfAnyKey(t *testing.T) {
	srv := apiServer(t, oddKeys)
	for i, k := range oddKeys {
		out, errOut, code := cli("get", "--server", srv.URL, "--objects", "model-to-app", k)
		if code != 0 || !strings.HasPrefix(out, `{"key":"meta-test/`+appName(i)+`"`) || strings.Count(out, "\n") != 1 {
			t.Errorf("get --objects model-to-app %q = exit %d %q %q", k, code, out, errOut)
		}
	}
	for _, args := range [][]string{
		{"get", "--server", srv.URL, "--resource", "", "x"},
		{"get", "--server", srv.URL, "--objects", "", "x"},
		{"get", "--server", srv.URL, "--objects", "model-to-app", ""},
	} {
		if out, errOut, code := cli(args...); code != 2 || out != "" || !strings.Contains(errOut, "non-empty") {
			t.Errorf("%q = exit %d %q %q", args, code, out, errOut)
		}
	}
	// --zone's value is "--", not the end of the flags: --node n after
	// the arguments is a flag.
	if out, errOut, code := cli("get", "--server", srv.URL, "--zone", "--", "model-to-app", "a?b=c", "--node", "n"); code != 1 || !strings.Contains(errOut, "zone") {
		t.Errorf("get --zone -- ... --node n = exit %d %q %q", code, out, errOut)
	}
}

// TestGetNotesNotSynced: values read before a resource's first list are
// printed as they are, and stderr says what an empty answer means then.
func TestGetNotesNotSynced(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	fake, err := metasynctest.New(appmodelsPlan(t), metasynctest.Unsynced("appmodels"))
	if err != nil {
		t.Fatal(err)
	}
	e := fake.Engine()
	srv := httptest.NewServer(server.New(e.Inspect(), quiet))
	t.Cleanup(srv.Close)
	for _, args := range [][]string{
		{"get", "model-to-app", "model1", "--server", srv.URL},
		{"get", "model-to-app", "--server", srv.URL},
		{"get", "--objects", "model-to-app", "model1", "--server", srv.URL},
	} {
		out, errOut, code := cli(args...)
		if code != 0 || out != "" || !strings.Contains(errOut, "not synced") {
			t.Errorf("%q = exit %d %q %q, want a note on stderr", args, code, out, errOut)
		}
	}
}

// TestIndexesShowsFailingRules: `metasync indexes` counts, per index, the
// objects whose rule fails now and names the last with its error; it is 0
// again once the object is fixed.
func TestIndexesShowsFailingRules(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	fake, err := metasynctest.New(appmodelsPlan(t))
	if err != nil {
		t.Fatal(err)
	}
	e, f := fake.Engine(), fake.Feed()
	srv := httptest.NewServer(server.New(e.Inspect(), quiet))
	t.Cleanup(srv.Close)
	bad, _ := json.Marshal(map[string]any{
		"apiVersion": "iidp.com/v1", "kind": "AppModel",
		"metadata": map[string]any{"name": "bad", "namespace": "meta-test", "labels": map[string]string{"iidp": "iidp"}},
		"spec":     map[string]any{"models": map[string]any{"not": "a list"}},
	})
	if err := f.Apply("appmodels", bad, appModelJSON(t, "good", "model1")); err == nil {
		t.Fatal("Apply of an object that breaks a rule reported nothing")
	}
	out, errOut, code := cli("indexes", "--server", srv.URL)
	for _, want := range []string{
		"model-to-app          appmodels       1     true    false  1        0\n",
		"model-to-addresses  model-to-app -> service-to-addresses  true\n",
		"  model-to-app: 1 object(s); last meta-test/bad at ",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("indexes = exit %d\n%s%s\nwant a line %q", code, out, errOut, want)
		}
	}
	if err := f.Apply("appmodels", appModelJSON(t, "bad", "model2")); err != nil {
		t.Fatal(err)
	}
	out, _, _ = cli("indexes", "--server", srv.URL)
	if !strings.Contains(out, "model-to-app          appmodels       2     true    false  0        0\n") || strings.Contains(out, "FAILING:") {
		t.Errorf("indexes once the object is fixed:\n%s", out)
	}
}

// TestVersionHelp: `version --help` prints its usage, not the version.
func TestVersionHelp(t *testing.T) {
	for _, args := range [][]string{{"version", "--help"}, {"version", "-h"}, {"help", "version"}} {
		out, errOut, code := cli(args...)
		if code != 0 || !strings.HasPrefix(out, "usage:\n  metasync version") || errOut != "" {
			t.Errorf("%q = exit %d %q %q", args, code, out, errOut)
		}
	}
	if _, errOut, code := cli("version", "--bogus"); code != 2 || !strings.Contains(errOut, `not "--bogus"`) {
		t.Errorf("version --bogus = exit %d %q", code, errOut)
	}
	if _, errOut, code := cli("version", "extra"); code != 2 || !strings.Contains(errOut, "usage") {
		t.Errorf("version extra = exit %d %q", code, errOut)
	}
}
