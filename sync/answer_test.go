package sync

import (
	"slices"
	"testing"

	"github.com/iidp/metasync/schema"
)

// TestAnswer: one call answers a lookup, a chain and the keys of an
// index, with Synced and Stale.
func TestAnswer(t *testing.T) {
	e := testEngine(t, &schema.Config{
		Resources: []schema.Resource{{
			Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
			Indexes: []schema.Index{
				{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"},
				{Name: "app-to-version", Key: "metadata.name", Value: "spec.version"},
			},
		}},
		Chains: []schema.Chain{{Name: "model-chain", Indexes: []string{"model-to-app", "app-to-version"}}},
	})
	w := watchersOf(e)[0]
	tx := w.Src.Begin()
	tx.Put(w.Project(`{"metadata":{"name":"a","namespace":"ns"},"spec":{"models":["m1","m2"],"version":"2.8"}}`).Ix)
	tx.Commit()
	for _, c := range []struct {
		t    Target
		want []string
	}{
		{KeyOf("model-to-app", "m1"), []string{"a"}},
		{ChainOf("model-chain", "m2"), []string{"2.8"}},
		{IndexOf("model-to-app"), []string{"m1", "m2"}},
		{KeyOf("model-to-app", "nope"), nil},
		{KeyOf("no-such-index", "m1"), nil},
	} {
		a := e.Inspect().Answer(c.t)
		if !slices.Equal(a.Values, c.want) || a.Stale {
			t.Errorf("Answer(%+v) = %+v, want values %q, not stale", c.t, a, c.want)
		}
		if want := e.Inspect().IndexSynced("model-to-app"); c.t.Index == "model-to-app" && a.Synced != want {
			t.Errorf("Answer(%+v).Synced = %t, IndexSynced %t", c.t, a.Synced, want)
		}
	}
	if a := e.Inspect().Answer(KeyOf("no-such-index", "m1")); a.Synced {
		t.Errorf("an unknown index answers synced: %+v", a)
	}
}
