package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestConflictsInTheCLI: a key claimed by two objects in a unique index
// is counted in the CONFLICTS column of `metasync indexes`, and `get` of
// it (or of a chain through it) notes the conflict on stderr, with the
// value on stdout as ever.
func TestConflictsInTheCLI(t *testing.T) {
	srv := apiServer(t, []string{"model1", "model1", "model2"})
	out, errOut, code := cli("indexes", "--server", srv.URL)
	if code != 0 || !strings.Contains(out, "FAILING  CONFLICTS\n") || !regexpLine(out, `model-to-app +appmodels +2 +true +false +0 +1`) ||
		!regexpLine(out, `service-to-addresses +endpointslices +0 +true +false +0 +-`) || !strings.Contains(out, "\nCONFLICTS: ") {
		t.Errorf("indexes = exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = cli("get", "--server", srv.URL, "model-to-app", "model1")
	want := "metasync: note: conflict: several objects claim model1 in the unique index model-to-app, with different values; the oldest's is answered (metasync get --explain model-to-app model1 names them)\n"
	if code != 0 || out != "app-a\n" || errOut != want {
		t.Errorf("get model-to-app model1 = exit %d %q %q, want the note %q", code, out, errOut, want)
	}
	if _, errOut, _ := cli("get", "--server", srv.URL, "--chain", "model-to-addresses", "model1"); !strings.Contains(errOut, "conflict: several objects claim model1 in the unique index model-to-app") {
		t.Errorf("get --chain through the conflict: stderr %q", errOut)
	}
	if out, errOut, code := cli("get", "--server", srv.URL, "model-to-app", "model2"); code != 0 || out != "app-c\n" || errOut != "" {
		t.Errorf("get of a key in no conflict = exit %d %q %q", code, out, errOut)
	}
}

// TestChainAsIndexHint: a chain asked for as an index (and an index as a
// chain) is a 404 that says which it is and how to ask.
func TestChainAsIndexHint(t *testing.T) {
	srv := apiServer(t, []string{"model1"})
	_, errOut, code := cli("get", "--server", srv.URL, "model-to-endpoints", "model1")
	if code != 1 || !strings.Contains(errOut, `unknown index "model-to-endpoints": it is a chain: /v1/chains/model-to-endpoints/keys/KEY (metasync get --chain model-to-endpoints KEY)`) {
		t.Errorf("get CHAIN KEY = exit %d %q", code, errOut)
	}
	_, errOut, code = cli("get", "--server", srv.URL, "--chain", "model-to-app", "model1")
	if code != 1 || !strings.Contains(errOut, `unknown chain "model-to-app": it is an index: /v1/indexes/model-to-app/keys/KEY (metasync get model-to-app KEY, without --chain)`) {
		t.Errorf("get --chain INDEX KEY = exit %d %q", code, errOut)
	}
}

// regexpLine reports whether some line of out matches re whole.
func regexpLine(out, re string) bool {
	return regexp.MustCompile(`(?m)^` + re + ` *$`).MatchString(out)
}

// TestExplainOneLinePerObject: an EndpointSlice that gives a key ready
// endpoints and (shadowed) terminating ones is one line of the tree, its
// values then its fallback's; a value hinted elsewhere names the
// caller's zone.
func TestExplainOneLinePerObject(t *testing.T) {
	answer := `{"chain":"model-to-endpoints","key":"model1","values":["10.0.1.7:8080"],"steps":[
	 {"index":"service-to-endpoints","keys":["base"],"values":["10.0.1.7:8080"],"synced":true,"objects":[
	  {"resource":"endpointslices","key":"meta-test/base-a","resourceVersion":"7","indexKey":"base","values":["10.0.0.5:8080"],"unanswered":["10.0.0.5:8080"],"why":"hinted for another zone or node than the caller's (zone=zone-b): hinted for zone=zone-a"},
	  {"resource":"endpointslices","key":"meta-test/base-b","resourceVersion":"8","indexKey":"base","values":["10.0.1.8:8080"],"fallback":true,"unanswered":["10.0.1.8:8080"],"why":"the index's fallback"},
	  {"resource":"endpointslices","key":"meta-test/base-b","resourceVersion":"8","indexKey":"base","values":["10.0.1.7:8080"]}]}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	defer srv.Close()
	out, errOut, code := cli("get", "--server", srv.URL, "--explain", "--chain", "model-to-endpoints", "model1")
	want := "chain model-to-endpoints model1 → 10.0.1.7:8080\n" +
		"└─ service-to-endpoints: base → 10.0.1.7:8080\n" +
		"   ├─ endpointslices meta-test/base-a (resourceVersion 7): base → 10.0.0.5:8080  [not answered: 10.0.0.5:8080, hinted for another zone or node than the caller's (zone=zone-b): hinted for zone=zone-a]\n" +
		"   └─ endpointslices meta-test/base-b (resourceVersion 8): base → 10.0.1.7:8080; fallback 10.0.1.8:8080  [not answered: 10.0.1.8:8080, the index's fallback]\n"
	if code != 0 || out != want {
		t.Errorf("explain = exit %d\n%s%s\nwant\n%s", code, out, errOut, want)
	}
}
