package consul

import (
	"net/http/httptest"
	"testing"
	"time"
)

// TestParseQuery: a blocking query's index and wait as Consul reads
// them; a wait of hours is cut to MaxWait.
func TestParseQuery(t *testing.T) {
	for q, want := range map[string]queryParams{
		"":                           {0, DefaultWait},
		"index=7":                    {7, DefaultWait},
		"index=7&wait=30s":           {7, 30 * time.Second},
		"index=7&wait=45":            {7, 45 * time.Second},
		"index=7&wait=100h":          {7, MaxWait},
		"index=18446744073709551615": {18446744073709551615, DefaultWait},
	} {
		got, bad := parseQuery(httptest.NewRequest("GET", "/v1/health/service/m?"+q, nil))
		if bad != "" || got != want {
			t.Errorf("%q: %+v %q, want %+v", q, got, bad, want)
		}
	}
	for _, q := range []string{"index=-1", "index=x", "index=18446744073709551616", "wait=forever", "wait=-1s"} {
		if _, bad := parseQuery(httptest.NewRequest("GET", "/v1/health/service/m?"+q, nil)); bad == "" {
			t.Errorf("%q accepted", q)
		}
	}
}

// TestParseSources: --consul-services.
func TestParseSources(t *testing.T) {
	got, err := ParseSources("chains/model-to-endpoints, indexes/model-to-app")
	if err != nil || len(got) != 2 || got[0] != (Source{"chains", "model-to-endpoints"}) || got[1] != (Source{"indexes", "model-to-app"}) {
		t.Errorf("ParseSources = %v, %v", got, err)
	}
	for _, bad := range []string{"", "model-to-app", "resources/x", "chains/", "chains/a/b", "chains/a,chains/a"} {
		if _, err := ParseSources(bad); err == nil {
			t.Errorf("ParseSources(%q) accepted", bad)
		}
	}
}
