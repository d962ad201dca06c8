package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
)

// oddKeys are keys that a URL path mangles unless they are escaped with
// care: dot segments (which clients and ServeMux clean away), separators,
// and the bytes that end a path or start an escape.
var oddKeys = []string{
	".", "..", "...", "./", "a/../b", "../x", "a/./b", "/", "//", "a//b", "/lead", "trail/",
	"%", "%2F", "%2E", "100%", "?", "a?b=c", "#", "#frag", "with space", " ", "+", "a;b", "ä", "&",
}

// appmodelsPlan is examples/appmodel's config, compiled.
func appmodelsPlan(t *testing.T) *schema.Plan {
	t.Helper()
	plan, err := schema.LoadPlan(filepath.Join("..", "..", "examples", "appmodel", "config.yaml"), schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// apiServer serves the HTTP API (internal/server) over an engine that was never started (no
// cluster) whose model-to-app index maps each of keys to "app-" + its
// position in keys.
func apiServer(t *testing.T, keys []string) *httptest.Server {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	fake, err := metasynctest.New(appmodelsPlan(t))
	if err != nil {
		t.Fatal(err)
	}
	e, f := fake.Engine(), fake.Feed()
	var objs [][]byte
	for i, k := range keys {
		objs = append(objs, appModelJSON(t, appName(i), k))
	}
	if err := f.Replace("appmodels", objs...); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(server.New(e.Inspect(), quiet))
	t.Cleanup(srv.Close)
	return srv
}

// appModelJSON is an AppModel that examples/appmodel's config watches.
func appModelJSON(t testing.TB, name string, models ...string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"apiVersion": "iidp.com/v1", "kind": "AppModel",
		"metadata": map[string]any{"name": name, "namespace": "meta-test", "labels": map[string]string{"iidp": "iidp"}},
		"spec":     map[string]any{"type": "model", "version": "1", "models": models},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func appName(i int) string { return "app-" + string(rune('a'+i)) }

// cli runs the CLI in process.
func cli(args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	err := run(args, &out, &errOut)
	if ee, ok := err.(exitError); ok {
		code = ee.code
	} else if err != nil {
		code = 1
		errOut.WriteString(err.Error())
	}
	return out.String(), errOut.String(), code
}

// TestGetAnyKey: `metasync get INDEX KEY` answers the values of KEY itself
// for every key, over the real HTTP API: "." and ".." are not cleaned into
// another path (on HEAD, "." listed the index's keys through a redirect and
// printed nothing, ".." got a 404), "/" "%" "?" "#" and spaces arrive as
// they are.
func TestGetAnyKey(t *testing.T) {
	srv := apiServer(t, oddKeys)
	for i, k := range oddKeys {
		out, errOut, code := cli("get", "--server", srv.URL, "model-to-app", k)
		if code != 0 || out != appName(i)+"\n" {
			t.Errorf("get model-to-app %q = %q, exit %d, stderr %q; want %s", k, out, code, errOut, appName(i))
		}
	}
	// A key nobody has: no values, exit 0, and not the answer of another path.
	for _, k := range []string{".", "..", "x"} {
		srv := apiServer(t, nil)
		out, errOut, code := cli("get", "--server", srv.URL, "model-to-app", k)
		if code != 0 || out != "" {
			t.Errorf("get %q from an empty index = %q, exit %d, %s", k, out, code, errOut)
		}
	}
}

// TestPathSegment: what the server receives for pathSegment(key) is key,
// and why it is needed: url.PathEscape leaves "." and "..", which ServeMux
// cleans away with a redirect to another path.
func TestPathSegment(t *testing.T) {
	srv := apiServer(t, nil)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, k := range oddKeys {
		resp, err := noRedirect.Get(srv.URL + "/v1/indexes/model-to-app/keys/" + pathSegment(k))
		if err != nil {
			t.Fatal(err)
		}
		var ans struct{ Key *string }
		err = json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil || ans.Key == nil || *ans.Key != k {
			t.Errorf("key %q sent as %q: %s, key %v, %v", k, pathSegment(k), resp.Status, ans.Key, err)
		}
	}
	for _, k := range []string{".", ".."} {
		resp, err := noRedirect.Get(srv.URL + "/v1/indexes/model-to-app/keys/" + url.PathEscape(k))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 3 {
			t.Logf("note: ServeMux no longer redirects %q sent as %q (%s)", k, url.PathEscape(k), resp.Status)
		}
	}
}

// TestGetListsKeys: `metasync get INDEX` prints every key, one per line,
// sorted, following the pages of the answer whatever their size.
func TestGetListsKeys(t *testing.T) {
	srv := apiServer(t, oddKeys)
	want := slices.Clone(oddKeys)
	slices.Sort(want)
	for _, limit := range []string{"", "1", "2", "7", "10000"} {
		args := []string{"get", "--server", srv.URL}
		if limit != "" {
			args = append(args, "--limit", limit)
		}
		out, errOut, code := cli(append(args, "model-to-app")...)
		got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if code != 0 || !slices.Equal(got, want) {
			t.Errorf("get --limit %q model-to-app = exit %d %q %s\nwant %q", limit, code, got, errOut, want)
		}
	}
	out, errOut, code := cli("get", "--server", srv.URL, "no-such-index")
	if code != 1 || out != "" || !strings.Contains(errOut, "no-such-index") || !strings.Contains(errOut, "404") {
		t.Errorf("get of an unknown index = exit %d %q %q", code, out, errOut)
	}
}

// TestIndexes: `metasync indexes` prints a table of the daemon's indexes.
func TestIndexes(t *testing.T) {
	srv := apiServer(t, []string{"model1", "model2", "model3"})
	out, errOut, code := cli("indexes", "--server", srv.URL)
	want := "NAME                  RESOURCE        KEYS  SYNCED  STALE  FAILING  CONFLICTS\n" +
		"model-to-app          appmodels       3     true    false  0        0\n" +
		"service-to-addresses  endpointslices  0     true    false  0        -\n" +
		"service-to-endpoints  endpointslices  0     true    false  0        -\n" +
		"\n" +
		"CHAIN               INDEXES                               SYNCED\n" +
		"model-to-addresses  model-to-app -> service-to-addresses  true\n" +
		"model-to-endpoints  model-to-app -> service-to-endpoints  true\n"
	if code != 0 || out != want {
		t.Errorf("indexes = exit %d\n%s%s\nwant\n%s", code, out, errOut, want)
	}
	if _, errOut, code := cli("indexes", "--server", srv.URL, "extra"); code != 2 || !strings.Contains(errOut, "usage") {
		t.Errorf("indexes with an argument = exit %d %q", code, errOut)
	}
	if _, errOut, code := cli("indexes", "--server", "http://127.0.0.1:1"); code != 1 || !strings.Contains(errOut, "cannot reach") {
		t.Errorf("indexes without a daemon = exit %d %q", code, errOut)
	}
}

// TestHelp: --help, -h and `help COMMAND` print the command's usage and
// flags on stdout and exit 0, for every command (on HEAD they exited 2).
func TestHelp(t *testing.T) {
	flags := map[string][]string{
		"serve":    {"-config", "-listen", "-kubeconfig"},
		"validate": {"-config", "-cluster"},
		"get":      {"-server", "-chain", "-limit"},
		"indexes":  {"-server"},
	}
	for name, want := range flags {
		for _, args := range [][]string{{name, "--help"}, {name, "-h"}, {name, "--config", "x", "-help"}, {"help", name}} {
			out, errOut, code := cli(args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "usage:\n  metasync "+name) {
				t.Errorf("%q = exit %d, stdout %q, stderr %q", args, code, out, errOut)
				continue
			}
			for _, f := range want {
				if !strings.Contains(out, "  "+f+" ") && !strings.Contains(out, "  "+f+"\n") {
					t.Errorf("%q: usage lacks %s:\n%s", args, f, out)
				}
			}
		}
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		out, _, code := cli(args...)
		if code != 0 || !strings.Contains(out, "metasync indexes") || !strings.Contains(out, "metasync get      [--server URL] INDEX ") {
			t.Errorf("%q = exit %d %q", args, code, out)
		}
	}
	// A bad flag is still a usage error, on stderr.
	out, errOut, code := cli("get", "--nope")
	if code != 2 || out != "" || !strings.Contains(errOut, "-nope") {
		t.Errorf("get --nope = exit %d %q %q", code, out, errOut)
	}
	// After "--", -h is an argument: here, a key.
	srv := apiServer(t, []string{"-h"})
	if out, errOut, code := cli("get", "--server", srv.URL, "--", "model-to-app", "-h"); code != 0 || out != "app-a\n" {
		t.Errorf("get -- model-to-app -h = exit %d %q %q", code, out, errOut)
	}
}

// TestValidateArgument: validate takes the file as an argument as well as
// with --config, flags before or after it, and counts in good grammar.
func TestValidateArgument(t *testing.T) {
	file := filepath.Join("..", "..", "examples", "appmodel", "config.yaml")
	want := "note: resources[0]: paths not checked: no CRD under crds: defines appmodels.iidp.com; validate --cluster checks them against the cluster's CRD\n" +
		file + ": valid: 2 resources, 3 indexes, 2 chains (paths of 1 resource not checked: see the note; --cluster checks them)\n"
	for _, args := range [][]string{
		{"validate", file},
		{"validate", "--config", file},
	} {
		out, errOut, code := cli(args...)
		if code != 0 || out != want {
			t.Errorf("%q = exit %d %q %q, want %q", args, code, out, errOut, want)
		}
	}
	// --cluster after the file is parsed as a flag: it needs a cluster.
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	if _, errOut, code := cli("validate", file, "--cluster"); code != 1 || !strings.Contains(errOut, "validate --cluster") {
		t.Errorf("validate FILE --cluster = exit %d %q", code, errOut)
	}
	for _, args := range [][]string{
		{"validate"},
		{"validate", file, file},
		{"validate", "--config", file, file},
		{"validate", file, "--config", file},
	} {
		if out, errOut, code := cli(args...); code != 2 || out != "" || errOut == "" {
			t.Errorf("%q = exit %d %q %q, want a usage error", args, code, out, errOut)
		}
	}
}

// TestValidateDiff: --diff OLD prints what a reload from OLD does.
func TestValidateDiff(t *testing.T) {
	dir := t.TempDir()
	old, err := os.ReadFile(filepath.Join("..", "..", "examples", "appmodel", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	oldPath, newPath := filepath.Join(dir, "old.yaml"), filepath.Join(dir, "new.yaml")
	next := strings.Replace(string(old), "labelSelector: iidp=iidp", "labelSelector: iidp=iidp,tier=a", 1)
	next = strings.Replace(next, "listen: 127.0.0.1:8080", "listen: 127.0.0.1:8090", 1)
	next = strings.Replace(next, "\nchains:", `
  - name: gadgets
    group: example.com
    version: v1
    resource: gadgets
    indexes:
      - {name: color-to-gadget, key: spec.color}
chains:`, 1)
	if !strings.Contains(next, "gadgets") || !strings.Contains(next, "tier=a") {
		t.Fatal("the example config changed: adapt the test")
	}
	_ = os.WriteFile(oldPath, old, 0o600)
	_ = os.WriteFile(newPath, []byte(next), 0o600)
	out, errOut, code := cli("validate", "--diff", oldPath, newPath)
	want := `note: resources[0]: paths not checked: no CRD under crds: defines appmodels.iidp.com; validate --cluster checks them against the cluster's CRD
note: resources[2]: paths not checked: no CRD under crds: defines gadgets.example.com; validate --cluster checks them against the cluster's CRD
start:          gadgets
restart:        appmodels
keep:           endpointslices
needs restart:  server.listen (a reload keeps the running value)
` + newPath + ": valid: 3 resources, 4 indexes, 2 chains (paths of 2 resources not checked: see the note; --cluster checks them)\n"
	if code != 0 || out != want {
		t.Errorf("validate --diff = exit %d\n%s%s\nwant\n%s", code, out, errOut, want)
	}
	if out, _, _ := cli("validate", "--diff", oldPath, oldPath); !strings.Contains(out, "\nkeep:           appmodels, endpointslices\nno change") {
		t.Errorf("validate --diff of the same config = %q", out)
	}
	if _, errOut, code := cli("validate", "--diff", filepath.Join(dir, "none.yaml"), newPath); code != 1 || !strings.Contains(errOut, "old config is invalid") {
		t.Errorf("validate --diff of a missing old config = exit %d %q", code, errOut)
	}
}

// TestPlural: one of a thing is singular, any other number plural.
func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 chains", 1: "1 chain", 2: "2 chains"} {
		if got := plural(n, "chain", "chains"); got != want {
			t.Errorf("plural(%d) = %q", n, got)
		}
	}
}

// TestVersionOf: a version set at build time wins; otherwise a release's
// module version, else dev- and the commit (+dirty), else "dev".
func TestVersionOf(t *testing.T) {
	vcs := func(mod, rev, modified string) *debug.BuildInfo {
		info := &debug.BuildInfo{Main: debug.Module{Path: "github.com/iidp/metasync", Version: mod}}
		if rev != "" {
			info.Settings = append(info.Settings, debug.BuildSetting{Key: "vcs.revision", Value: rev}, debug.BuildSetting{Key: "vcs.modified", Value: modified})
		}
		return info
	}
	const rev = "9ba5f88c0ffee0123456789abcdef0123456789a"
	for _, c := range []struct {
		info *debug.BuildInfo
		want string
	}{
		{vcs("(devel)", rev, "false"), "dev-9ba5f88"},
		{vcs("(devel)", rev, "true"), "dev-9ba5f88+dirty"},
		{vcs("v0.0.0-20260102150405-9ba5f88c0ffe+dirty", rev, "true"), "dev-9ba5f88+dirty"},
		{vcs("v1.2.4-0.20260102150405-9ba5f88c0ffe", rev, "false"), "dev-9ba5f88"},
		{vcs("v1.2.3", "", ""), "v1.2.3"},
		{vcs("v1.2.3+dirty", rev, "true"), "v1.2.3+dirty"},
		{vcs("v0.0.0-20260102150405-9ba5f88c0ffe", "", ""), "v0.0.0-20260102150405-9ba5f88c0ffe"},
		{vcs("(devel)", "", ""), "dev"},
		{vcs("", "", ""), "dev"},
	} {
		if got := versionOf(c.info, "dev"); got != c.want {
			t.Errorf("versionOf(%s, %v) = %q, want %q", c.info.Main.Version, c.info.Settings, got, c.want)
		}
	}
	if got := buildVersion("1.0.0-rc1"); got != "1.0.0-rc1" {
		t.Errorf("a version set by ldflags became %q", got)
	}
}
