package auth

import (
	"net/http/httptest"
	"testing"
)

// TestBearerSchemeInAnyCase: the scheme's name is matched in any case, as
// the apiserver matches it; what follows it is the token.
func TestBearerSchemeInAnyCase(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer abc": "abc", "bearer abc": "abc", "BEARER abc": "abc", "Bearer  abc ": "abc",
		"Bearer": "", "Bearer ": "", "Basic abc": "", "Bearerabc": "", "": "",
	} {
		got, ok := bearer(header)
		if got != want || ok != (want != "" || header == "Bearer ") {
			t.Errorf("bearer(%q) = %q %v, want %q", header, got, ok, want)
		}
	}
}

// TestAccessPathOfObjects: an object's fields are granted per resource,
// the list of chains as a path of its own, service discovery as the
// lookups of its chain or index.
func TestAccessPathOfObjects(t *testing.T) {
	for target, want := range map[string]string{
		"/v1/resources/appmodels/objects/meta-test%2Fbase": "/v1/resources/appmodels/*",
		"/v1/indexes/model-to-app/keys/m/objects":          "/v1/indexes/model-to-app/*",
		"/v1/chains":                         "/v1/chains",
		"/v1/chains/model-to-addresses/keys": "/v1/chains/model-to-addresses/*",
		"/v1/sd/chains/model-to-endpoints":   "/v1/chains/model-to-endpoints/*",
		"/v1/sd/indexes/model-to-app":        "/v1/indexes/model-to-app/*",
		"/v1/sd/chains/":                     "/v1/*",
		"/v1/sd/nothing":                     "/v1/*",
	} {
		if got := accessPath(httptest.NewRequest("GET", target, nil).URL); got != want {
			t.Errorf("accessPath(%s) = %s, want %s", target, got, want)
		}
	}
}
