package sync

import (
	"testing"

	"github.com/iidp/metasync/schema"
)

// TestAnswerAcrossAReload: a reload that moves a chain to a resource not
// listed yet, while Answer reads it, never makes an answer "synced" with
// the new config's (empty) values: flags and values are of one config.
func TestAnswerAcrossAReload(t *testing.T) {
	cfgA := &schema.Config{
		Resources: []schema.Resource{appsResource(), servicesResource()},
		Chains:    []schema.Chain{{Name: "c", Indexes: []string{"model-to-app", "app-to-vip"}}},
	}
	cfgB := &schema.Config{
		Resources: []schema.Resource{appsResource(), servicesResource(), slicesResource()},
		Chains:    []schema.Chain{{Name: "c", Indexes: []string{"model-to-app", "app-to-addresses"}}},
	}
	e := testEngine(t, cfgA)
	v, _ := e.view()
	apps, svcs := v.byName["apps"].lead(), v.byName["services"].lead()
	if err := apps.Replace([]any{apps.Project(string(appPrimaryJSON("a", "m1", "m1")))}, "1"); err != nil {
		t.Fatal(err)
	}
	if err := svcs.Replace([]any{svcs.Project(string(serviceJSON("s", "a", "10.0.0.1")))}, "1"); err != nil {
		t.Fatal(err)
	}
	if a := e.Inspect().Answer(ChainOf("c", "m1")); !a.Synced || len(a.Values) != 1 {
		t.Fatalf("A: %+v", a)
	}
	reloadTo(t, e, cfgB)
	if a := e.Inspect().Answer(ChainOf("c", "m1")); a.Synced {
		t.Fatalf("B: %+v", a)
	}
	answer := func() Answer { return e.Inspect().Answer(ChainOf("c", "m1")) }
	bad := 0
	for round := 0; round < 300 && bad == 0; round++ {
		reloadTo(t, e, cfgA)
		done := make(chan struct{})
		go func() { reloadTo(t, e, cfgB); close(done) }()
		for running := true; running; {
			select {
			case <-done:
				running = false
			default:
			}
			if a := answer(); a.Synced && len(a.Values) == 0 {
				bad++
				t.Errorf("round %d: one reload A->B, an answer synced with no values: %+v", round, a)
				break
			}
		}
		<-done
	}
}
