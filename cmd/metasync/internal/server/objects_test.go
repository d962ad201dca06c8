package server

import (
	"net/http/httptest"
	"strings"
	"testing"
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
