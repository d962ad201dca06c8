package schema

import (
	"strings"
	"testing"

	"github.com/iidp/metasync/internal/plan"
)

// TestFallback: an index's fallback compiles into an index of its own that
// backs it, hidden from the config's names; a bad one is a problem at its
// field path, and a chain cannot name the hidden index.
func TestFallback(t *testing.T) {
	sliceConfig := func(ix ...Index) *Config {
		return &Config{
			Resources: []Resource{{Name: "endpointslices", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices", Indexes: ix}},
		}
	}
	p, err := Compile(sliceConfig(Index{Name: "service-to-addresses", Key: `metadata.labels.kubernetes\.io/service-name`, Value: "@endpoints", Fallback: `@endpoints:{"terminating":true}`}))
	if err != nil {
		t.Fatal(err)
	}
	ixs := plan.Of(p).Resources[0].Indexes
	if len(ixs) != 2 || ixs[0].Fallback != "service-to-addresses/fallback" || ixs[1].Name != ixs[0].Fallback ||
		ixs[1].FallbackOf != "service-to-addresses" || ixs[1].Value.String() != `@endpoints:{"terminating":true}` || ixs[1].Key != ixs[0].Key {
		t.Fatalf("compiled %+v", ixs)
	}

	cfg := sliceConfig(
		Index{Name: "a", Key: "k", Fallback: `@endpoints:{"terminate":true}`},
		Index{Name: "b", Key: "k", Fallback: "spec.x|"},
		Index{Name: "c", Key: "k", Value: "@endpoints:http"},
		Index{Name: "d", Key: "k", Hints: `@endpoints:{"hint":true}`},
	)
	cfg.Chains = []Chain{{Name: "ch", Indexes: []string{"a", "a/fallback"}}}
	_, err = Compile(cfg)
	for _, want := range []string{
		`resources[0].indexes[0].fallback: "@endpoints:{\"terminate\":true}": argument of @endpoints {"terminate":true}: json: unknown field "terminate"`,
		`resources[0].indexes[1].fallback: "spec.x|": ends with "|"`,
		`resources[0].indexes[2].value: "@endpoints:http": argument of @endpoints http: invalid character 'h' looking for beginning of value`,
		`chains[0].indexes[1]: unknown index "a/fallback"`,
		`resources[0].indexes[3].hints: "@endpoints:{\"hint\":true}": argument of @endpoints {"hint":true}: json: unknown field "hint"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing problem %q in:\n%v", want, err)
		}
	}
}
