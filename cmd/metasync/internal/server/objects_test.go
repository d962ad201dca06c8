package server

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/iidp/metasync/internal/wire"
	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
)

// TestObjectsAndChains: the chains' list, an object's fields by its key,
// the objects behind an index key, and JSON for every refusal.
func TestObjectsAndChains(t *testing.T) {
	s := fedServer(t, map[string][]string{"base": {"model1", "model2"}, "iiot": {"model2"}})
	for _, c := range []struct {
		target string
		code   int
		body   string
	}{
		{"/v1/chains", 200, `{"chains":[{"name":"model-to-addresses","indexes":["model-to-app","service-to-addresses"],"synced":true},{"name":"model-to-endpoints","indexes":["model-to-app","service-to-endpoints"],"synced":true}]}`},
		{"/v1/resources/appmodels/objects/meta-test%2Fbase", 200, `{"resource":"appmodels","key":"meta-test/base","fields":{"models":["model1","model2"],"name":"base"}}`},
		{"/v1/resources/appmodels/objects/meta-test/base", 200, `{"resource":"appmodels","key":"meta-test/base","fields":{"models":["model1","model2"],"name":"base"}}`},
		// model-to-app is unique: base and iiot claim model2 (neither has a
		// creation time: by object key), base answers, and is the object
		// behind the key.
		{"/v1/indexes/model-to-app/keys/model2/objects", 200, `{"index":"model-to-app","key":"model2","objects":[{"key":"meta-test/base","fields":{"models":["model1","model2"],"name":"base"}}]}`},
		{"/v1/indexes/model-to-app/keys/nope/objects", 200, `{"index":"model-to-app","key":"nope","objects":[]}`},
		{"/v1/resources/appmodels/objects/meta-test%2Fnope", 404, `{"error":"resource appmodels has no object \"meta-test/nope\" (an object key is namespace/name, or name when cluster-scoped)"}`},
		{"/v1/resources/widgets/objects/x", 404, `{"error":"unknown resource \"widgets\" (known: appmodels, endpointslices)"}`},
		{"/v1/resources/endpointslices/objects/x", 404, "declares no fields: add `fields:` to its resource entry in the config"},
		{"/v1/indexes/nope/keys/k/objects", 404, `{"error":"unknown index \"nope\"`},
		{"/v1/chains/model-to-addresses/keys", 404, `GET /v1/indexes/model-to-app/keys`},
		{"/v1/chains/nope/keys", 404, `unknown chain \"nope\"`},
		{"/v1/chains/model-to-addresses", 404, `{"error":"no such endpoint: /v1/chains/model-to-addresses"}`},
	} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", c.target, nil))
		body := strings.TrimSpace(rec.Body.String())
		if rec.Code != c.code || !strings.Contains(body, c.body) || !strings.HasPrefix(body, "{") {
			t.Errorf("GET %s = %d %s, want %d with %s", c.target, rec.Code, body, c.code, c.body)
		}
	}
}

// TestObjectBeforeTheFirstList: a resource that has not completed a list
// does not say "no such object" (it does not know yet): 503, Retry-After.
func TestObjectBeforeTheFirstList(t *testing.T) {
	s := offlineServer(t)
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/resources/appmodels/objects/meta-test%2Fbase", nil))
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "not known yet") {
		t.Errorf("GET before the first list = %d %s", rec.Code, rec.Body)
	}
}

// TestObjectsOfClusters: of a config that reads two clusters, every
// answer that names objects gives each its key as namespace/name and
// its cluster beside it: explain, the objects behind a key, an object by
// its key (?cluster= names one cluster's; without it, a key in both
// answers each; CLUSTER:key, the engine's form, is taken too) and the
// last rule failure of /v1/indexes and /readyz?verbose.
func TestObjectsOfClusters(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{
		Clusters: []schema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/nowhere/kubeconfig"}},
		Resources: []schema.Resource{{Name: "apps", Version: "v1", Resource: "configmaps",
			Fields:  map[string]string{"addr": "data.addr"},
			Indexes: []schema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	cm := func(name, app, addr string) string {
		return `{"metadata":{"name":"` + name + `","namespace":"ns"},"data":{"app":` + app + `,"addr":"` + addr + `"}}`
	}
	for _, err := range []error{
		fake.Apply("apps", cm("same", `"shop"`, "e:80")), fake.Apply("apps", cm("e1", `"shop"`, "e1:80")),
		fake.In("west").Apply("apps", cm("same", `"shop"`, "w:80")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := fake.In("west").Apply("apps", cm("odd", `{"not":"a string"}`, "x:80")); err == nil {
		t.Fatal("a rule that fails: no error")
	}
	s := New(fake.Engine().Inspect(), quietLog())
	const (
		e1   = `{"key":"ns/e1","cluster":"east","fields":{"addr":"e1:80"}}`
		east = `{"key":"ns/same","cluster":"east","fields":{"addr":"e:80"}}`
		west = `{"key":"ns/same","cluster":"west","fields":{"addr":"w:80"}}`
	)
	for _, c := range []struct {
		target string
		code   int
		body   string
	}{
		{"/v1/resources/apps/objects/ns%2Fsame", 200, `{"resource":"apps","key":"ns/same","cluster":"east","fields":{"addr":"e:80"},"objects":[` + east + `,` + west + `]}`},
		{"/v1/resources/apps/objects/ns/same?cluster=west", 200, `{"resource":"apps","key":"ns/same","cluster":"west","fields":{"addr":"w:80"}}`},
		{"/v1/resources/apps/objects/ns/e1", 200, `{"resource":"apps","key":"ns/e1","cluster":"east","fields":{"addr":"e1:80"}}`},
		{"/v1/resources/apps/objects/west:ns%2Fsame", 200, `{"resource":"apps","key":"ns/same","cluster":"west","fields":{"addr":"w:80"}}`},
		{"/v1/resources/apps/objects/west:ns%2Fsame?cluster=west", 200, `{"resource":"apps","key":"ns/same","cluster":"west","fields":{"addr":"w:80"}}`},
		{"/v1/resources/apps/objects/ns/e1?cluster=west", 404, `{"error":"resource apps has no object \"ns/e1\" in cluster west (an object key is namespace/name, or name when cluster-scoped)"}`},
		{"/v1/resources/apps/objects/west:ns/same?cluster=east", 400, `{"error":"object key \"west:ns/same\" names cluster west, and cluster=east another: give one of them"}`},
		{"/v1/resources/apps/objects/ns/same?cluster=north", 400, `{"error":"unknown cluster \"north\" (known: east, west)"}`},
		{"/v1/indexes/app-to-addr/keys/shop/objects", 200, `{"index":"app-to-addr","key":"shop","objects":[` + e1 + `,` + east + `,` + west + `]}`},
		{"/v1/indexes/app-to-addr/keys/shop/objects?cluster=west", 400, `picks an object's cluster`},
		{"/v1/indexes", 200, `"lastRuleError":{"object":"ns/odd","cluster":"west","error":`},
		{"/readyz?verbose", 200, `"lastRuleError":{"object":"ns/odd","cluster":"west","error":`},
	} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", c.target, nil))
		body := strings.TrimSpace(rec.Body.String())
		if rec.Code != c.code || !strings.Contains(body, c.body) {
			t.Errorf("GET %s = %d %s, want %d with %s", c.target, rec.Code, body, c.code, c.body)
		}
	}

	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/indexes/app-to-addr/keys/shop?explain=true", nil))
	var ans wire.Lookup
	if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil || len(ans.Steps) != 1 {
		t.Fatalf("explained: %d %s", rec.Code, rec.Body)
	}
	var got []string
	for _, o := range ans.Steps[0].Objects {
		got = append(got, o.Cluster+" "+o.Key)
	}
	slices.Sort(got)
	if want := []string{"east ns/e1", "east ns/same", "west ns/same"}; !slices.Equal(got, want) || strings.Contains(rec.Body.String(), `:ns/`) {
		t.Errorf("explained objects %q, want %q: %s", got, want, rec.Body)
	}
}
