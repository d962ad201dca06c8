package metasynctest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// appAt is an AppModel of meta-test created at the given time.
func appAt(name, created string, models ...string) string {
	ms, _ := json.Marshal(models)
	return fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"meta-test","labels":{"iidp":"iidp"},"creationTimestamp":%q},"spec":{"models":%s}}`, name, created, ms)
}

// TestExplainAndConflicts: two AppModels claim one model of the unique
// model-to-app: the oldest answers, explain names both and marks it, the
// conflict is counted; the older gone, the other answers. A chain is
// explained step by step; an unsynced resource says so.
func TestExplainAndConflicts(t *testing.T) {
	fake, err := metasynctest.Load(appmodelConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.Apply("appmodels", appAt("young", "2026-03-01T00:00:00Z", "model1", "model2")); err != nil {
		t.Fatal(err)
	}
	if err := fake.Apply("appmodels", appAt("old", "2025-04-24T03:40:36Z", "model1")); err != nil {
		t.Fatal(err)
	}
	if got := fake.Lookup("model-to-app", "model1"); !slices.Equal(got, []string{"old"}) {
		t.Fatalf("model1 = %v, want the oldest claimant's [old]", got)
	}
	if got := fake.Lookup("model-to-app", "model2"); !slices.Equal(got, []string{"young"}) {
		t.Fatalf("model2 = %v, want [young]", got)
	}
	x := fake.Explain(msync.KeyOf("model-to-app", "model1"))
	if len(x.Steps) != 1 || !slices.Equal(x.Values, []string{"old"}) {
		t.Fatalf("explain: %+v", x)
	}
	st := x.Steps[0]
	if !slices.Equal(st.Conflicts, []string{"model1"}) || len(st.Objects) != 2 {
		t.Fatalf("explain step: %+v", st)
	}
	if o := st.Objects[0]; o.Key != "meta-test/old" || !o.Chosen || o.ResourceVersion == "" || o.Created.Year() != 2025 || !slices.Equal(o.Values, []string{"old"}) {
		t.Fatalf("first claimant: %+v", o)
	}
	if o := st.Objects[1]; o.Key != "meta-test/young" || o.Chosen || !slices.Equal(o.Values, []string{"young"}) ||
		!slices.Equal(o.Unanswered, []string{"young"}) || o.Why != msync.ExplainYounger {
		t.Fatalf("second claimant: %+v", o)
	}
	if c := fake.Conflicts(); len(c) != 1 || c[0].Index != "model-to-app" || !slices.Equal(c[0].Keys, []string{"model1"}) {
		t.Fatalf("Conflicts = %+v", c)
	}
	for _, ix := range fake.Indexes() {
		if ix.Name == "model-to-app" && (!ix.Unique || ix.Conflicts != 1) {
			t.Fatalf("IndexInfo = %+v", ix)
		}
	}

	explainChainSteps(t, fake)
	explainInZoneA(t, fake)
	explainTerminating(t, fake)

	// The older gone: the other answers, no conflict.
	if err := fake.Delete("appmodels", "meta-test/old"); err != nil {
		t.Fatal(err)
	}
	if got := fake.Lookup("model-to-app", "model1"); !slices.Equal(got, []string{"young"}) {
		t.Fatalf("model1 = %v once old is gone, want [young]", got)
	}
	if c := fake.Conflicts(); len(c) != 0 {
		t.Fatalf("Conflicts = %+v once old is gone", c)
	}
	x = fake.Explain(msync.ChainOf("model-to-addresses", "model1"))
	if st := x.Steps[len(x.Steps)-1]; len(x.Values) != 0 || st.Empty != msync.ExplainUnknownKey || !slices.Equal(st.Keys, []string{"young"}) {
		t.Fatalf("young has no slice: %+v", x)
	}
	if x := fake.Explain(msync.KeyOf("model-to-app", "nobody")); len(x.Steps) != 1 || x.Steps[0].Empty != msync.ExplainUnknownKey {
		t.Fatalf("unknown key: %+v", x)
	}
	if x := fake.Explain(msync.KeyOf("no-such-index", "k")); len(x.Steps) != 1 || x.Steps[0].Empty != msync.ExplainUnknownIndex {
		t.Fatalf("unknown index: %+v", x)
	}

	unsynced, err := metasynctest.Load(appmodelConfig(), metasynctest.Unsynced("endpointslices"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unsynced.Apply("appmodels", appAt("old", "2025-04-24T03:40:36Z", "model1")); err != nil {
		t.Fatal(err)
	}
	x = unsynced.Explain(msync.ChainOf("model-to-addresses", "model1"))
	if st := x.Steps[len(x.Steps)-1]; len(x.Steps) != 2 || st.Synced || st.Empty != msync.ExplainNotSynced || x.Synced {
		t.Fatalf("unsynced step: %+v", x)
	}
}

// explainChainSteps: once old has an endpoint slice, model-to-addresses is
// explained step by step, and answers as Resolve does.
func explainChainSteps(t *testing.T, fake *metasynctest.Fake) {
	err := fake.Apply("endpointslices", `{"metadata":{"name":"old-a","namespace":"meta-test","labels":{"kubernetes.io/service-name":"old"}},
"ports":[{"name":"grpc","port":9090}],"endpoints":[{"addresses":["10.0.0.5"],"conditions":{"ready":true}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	x := fake.Explain(msync.ChainOf("model-to-addresses", "model1"))
	if !slices.Equal(x.Values, []string{"10.0.0.5"}) || len(x.Steps) != 2 || !x.Synced {
		t.Fatalf("chain explain: %+v", x)
	}
	if st := x.Steps[1]; st.Index != "service-to-addresses" || !slices.Equal(st.Keys, []string{"old"}) || len(st.Objects) != 1 ||
		st.Objects[0].Key != "meta-test/old-a" || st.Objects[0].Resource != "endpointslices" || st.Objects[0].IndexKey != "old" {
		t.Fatalf("chain step 2: %+v", st)
	}
	if got := fake.Resolve("model-to-addresses", "model1"); !slices.Equal(got, x.Values) {
		t.Fatalf("Resolve = %v, explain %v", got, x.Values)
	}
}

// explainInZoneA: a caller in zone a; the endpoint hinted for zone b is not
// answered, and explain says why, naming both zones.
func explainInZoneA(t *testing.T, fake *metasynctest.Fake) {
	err := fake.Apply("endpointslices", `{"metadata":{"name":"old-a","namespace":"meta-test","labels":{"kubernetes.io/service-name":"old"}},
"endpoints":[{"addresses":["10.0.0.5"],"hints":{"forZones":[{"name":"a"}]}},{"addresses":["10.0.0.6"],"hints":{"forZones":[{"name":"b"}]}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	at := msync.ChainOf("model-to-addresses", "model1")
	at.At = msync.Locality{Zone: "a"}
	x := fake.Explain(at)
	if o := x.Steps[1].Objects[0]; !slices.Equal(x.Values, []string{"10.0.0.5"}) || !slices.Equal(o.Unanswered, []string{"10.0.0.6"}) || o.Why != msync.ExplainElsewhere+" (zone=a): hinted for zone=b" {
		t.Fatalf("explained in zone a: %+v", x)
	}
}

// explainTerminating: a terminating endpoint beside a ready one is not
// answered (kube-proxy's graceful termination), and explain says why; once
// the ready one goes, the terminating one is answered, from the fallback.
func explainTerminating(t *testing.T, fake *metasynctest.Fake) {
	err := fake.Apply("endpointslices", `{"metadata":{"name":"old-a","namespace":"meta-test","labels":{"kubernetes.io/service-name":"old"}},
"endpoints":[{"addresses":["10.0.0.5"],"conditions":{"ready":true}},{"addresses":["10.0.0.7"],"conditions":{"ready":false,"serving":true,"terminating":true}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	x := fake.Explain(msync.KeyOf("service-to-addresses", "old"))
	if objs := x.Steps[0].Objects; !slices.Equal(x.Values, []string{"10.0.0.5"}) || len(objs) != 2 || objs[1].Why != msync.ExplainShadowed ||
		!objs[1].Fallback || !slices.Equal(objs[1].Unanswered, []string{"10.0.0.7"}) || len(objs[0].Unanswered) != 0 {
		t.Fatalf("a terminating endpoint beside a ready one: %+v", x)
	}
	err = fake.Apply("endpointslices", `{"metadata":{"name":"old-a","namespace":"meta-test","labels":{"kubernetes.io/service-name":"old"}},
"endpoints":[{"addresses":["10.0.0.7"],"conditions":{"ready":false,"serving":true,"terminating":true}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	x = fake.Explain(msync.KeyOf("service-to-addresses", "old"))
	if objs := x.Steps[0].Objects; !slices.Equal(x.Values, []string{"10.0.0.7"}) || len(objs) != 1 || !objs[0].Fallback || len(objs[0].Unanswered) != 0 {
		t.Fatalf("only a terminating endpoint: %+v", x)
	}
}

// TestFakeReload: a reload that turns unique off answers every claimant,
// on again the oldest; one that restarts a resource starts it empty and
// synced; one that removes a chain ends its subscriptions.
func TestFakeReload(t *testing.T) {
	plan := func(mutate func(*schema.Config)) *schema.Plan {
		t.Helper()
		cfg, err := schema.Load(appmodelConfig(), schema.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mutate(cfg)
		p, err := schema.Compile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	same := plan(func(*schema.Config) {})
	fake, err := metasynctest.New(same)
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.Apply("appmodels", appAt("young", "2026-03-01T00:00:00Z", "model1")+"\n---\n"+appAt("old", "2025-04-24T03:40:36Z", "model1")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := fake.Subscribe(ctx, msync.ChainOf("model-to-addresses", "model1"))
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := sub.Next(ctx); err != nil || ev.Type != msync.EventSnapshot {
		t.Fatalf("first event %+v, %v", ev, err)
	}

	notUnique := plan(func(c *schema.Config) { c.Resources[0].Indexes[0].Unique = false })
	if ch, err := fake.Reload(notUnique); err != nil || !slices.Equal(ch.Unique, []string{"model-to-app"}) || len(ch.Restart) != 0 {
		t.Fatalf("unique off: %+v, %v", ch, err)
	}
	if got := fake.Lookup("model-to-app", "model1"); !slices.Equal(got, []string{"old", "young"}) {
		t.Fatalf("unique off: model1 = %v", got)
	}
	if _, err := fake.Reload(same); err != nil {
		t.Fatal(err)
	}
	if got := fake.Lookup("model-to-app", "model1"); !slices.Equal(got, []string{"old"}) {
		t.Fatalf("unique on: model1 = %v", got)
	}

	restarted := plan(func(c *schema.Config) { c.Resources[0].LabelSelector = "iidp=iidp,tier=gold" })
	if ch, err := fake.Reload(restarted); err != nil || !slices.Equal(ch.Restart, []string{"appmodels"}) {
		t.Fatalf("restart: %+v, %v", ch, err)
	}
	if got := fake.Lookup("model-to-app", "model1"); len(got) != 0 {
		t.Fatalf("a restarted resource starts empty: model1 = %v", got)
	}
	for _, ix := range fake.Indexes() {
		if ix.Resource == "appmodels" && !ix.Synced {
			t.Fatalf("a restarted resource starts synced: %+v", ix)
		}
	}

	noChains := plan(func(c *schema.Config) { c.Chains = nil })
	if _, err := fake.Reload(noChains); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("the chain's subscription after its removal: %v", err)
		}
		if ev.Type == msync.EventGone {
			break
		}
	}
}

// TestApplyDuringReload: Apply of objects whose rules fail, while Reload
// restarts their resource again and again, is safe under -race: a
// restarted resource's watch is set up before another writer reaches it.
func TestApplyDuringReload(t *testing.T) {
	load := func(selector string) *schema.Plan {
		t.Helper()
		cfg, err := schema.Load(appmodelConfig(), schema.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Resources[0].LabelSelector = selector
		p, err := schema.Compile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	plans := []*schema.Plan{load("iidp=iidp"), load("iidp in (iidp)")}
	fake, err := metasynctest.New(plans[0])
	if err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// spec.models an object: the rule fails, and says so.
			_ = fake.Apply("appmodels", fmt.Sprintf(`{metadata: {name: a%d, namespace: meta-test, labels: {iidp: iidp}}, spec: {models: {x: 1}}}`, i%5))
		}
	}()
	for i := range 300 {
		if _, err := fake.Reload(plans[(i+1)%2]); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
}
