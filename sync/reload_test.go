package sync

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/iidp/metasync/schema"
)

// --- helpers of the reload tests ---

func appsResource() schema.Resource {
	return schema.Resource{Name: "apps", Version: "v1", Resource: "apps",
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}}}
}

func slicesResource() schema.Resource {
	return schema.Resource{Name: "slices", Version: "v1", Resource: "slices",
		Indexes: []schema.Index{{Name: "app-to-addresses", Key: "metadata.labels.app", Value: "addresses"}}}
}

func podsResource() schema.Resource {
	return schema.Resource{Name: "pods", Version: "v1", Resource: "pods",
		Indexes: []schema.Index{{Name: "node-to-pod", Key: "spec.node", Value: "metadata.name"}}}
}

func servicesResource() schema.Resource {
	return schema.Resource{Name: "services", Version: "v1", Resource: "services",
		Indexes: []schema.Index{{Name: "app-to-vip", Key: "metadata.labels.app", Value: "spec.vip"}}}
}

var routingChain = schema.Chain{Name: "model-to-addresses", Indexes: []string{"model-to-app", "app-to-addresses"}}

func podJSON(name, node string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": name}, "spec": map[string]any{"node": node}})
	return b
}

func serviceJSON(name, app, vip string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": name, "labels": map[string]string{"app": app}}, "spec": map[string]any{"vip": vip}})
	return b
}

// appPrimaryJSON is an app with models and one primary model.
func appPrimaryJSON(name, primary string, models ...string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": name}, "spec": map[string]any{"models": models, "primary": primary}})
	return b
}

// reloadTo compiles cfg and reloads e with it.
func reloadTo(tb testing.TB, e *Engine, cfg *schema.Config) schema.Changes {
	tb.Helper()
	plan, err := schema.Compile(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	changes, err := e.Reload(plan)
	if err != nil {
		tb.Fatalf("Reload: %v", err)
	}
	return changes
}

// list gives the current watcher of a resource its complete list of objs,
// as its reflector's list would, and returns that watcher.
func list(tb testing.TB, e *Engine, resource string, objs ...[]byte) *follow.Watcher {
	tb.Helper()
	v, _ := e.view()
	r := v.byName[resource]
	if r == nil {
		tb.Fatalf("no watcher of resource %q", resource)
	}
	w := r.lead()
	items := make([]any, len(objs))
	for i, o := range objs {
		items[i] = w.Project(string(o))
	}
	must(tb, w.Replace(items, ""))
	return w
}

func statusOf(tb testing.TB, e *Engine, resource string) ResourceStatus {
	tb.Helper()
	for _, st := range e.Status() {
		if st.Name == resource {
			return st
		}
	}
	tb.Fatalf("no status of resource %q", resource)
	return ResourceStatus{}
}

// quiet checks that s has nothing to deliver: Next waits until its
// context's deadline.
func quiet(t *testing.T, s *Subscription, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if ev, err := s.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s: Next = %+v, %v; want nothing (context.DeadlineExceeded)", what, ev, err)
	}
}

// want checks the next event of s.
func want(t *testing.T, s *Subscription, what string, typ EventType, values ...string) {
	t.Helper()
	ev := next(t, s)
	if ev.Type != typ || !slices.Equal(ev.Values, values) {
		t.Fatalf("%s: event %v %q %v, want %v %v", what, ev.Type, ev.Key, ev.Values, typ, values)
	}
}

// drainIndex takes the events of an index subscription until it is quiet,
// as key=values strings in order.
func drainIndex(t *testing.T, s *Subscription) []string {
	t.Helper()
	var out []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		ev, err := s.Next(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("index subscription: %v", err)
		}
		if ev.Type == EventSynced {
			out = append(out, "synced")
			continue
		}
		out = append(out, ev.Type.String()+" "+ev.Key+"="+strings.Join(ev.Values, ","))
	}
}

// gone checks that s says EventGone, then ErrClosed.
func gone(t *testing.T, s *Subscription, what string) {
	t.Helper()
	if ev := next(t, s); ev.Type != EventGone {
		t.Fatalf("%s: %+v, want EventGone", what, ev)
	}
	if ev, err := s.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("%s: after EventGone: %+v, %v; want ErrClosed", what, ev, err)
	}
}

// --- the reload tests ---

// TestReloadKeepsUnchanged proves that a reload that adds a resource
// leaves the others alone: the same watchers, the same answers, and no
// event to their subscribers; and that the added resource's index is
// there at once, empty, not synced, Syncing without making the engine
// unready, until its first list.
func TestReloadKeepsUnchanged(t *testing.T) {
	cfg := &schema.Config{Resources: []schema.Resource{appsResource(), slicesResource()}, Chains: []schema.Chain{routingChain}}
	e := testEngine(t, cfg)
	list(t, e, "apps", appJSON("a", "m1"), appJSON("b", "m1", "m2"))
	list(t, e, "slices", sliceJSON("a-1", "a", "10.0.0.1"), sliceJSON("b-1", "b", "10.0.0.2"))
	before, _ := e.view()

	keySub, err := e.Subscribe(context.Background(), KeyOf("model-to-app", "m1"))
	must(t, err)
	defer keySub.Close()
	want(t, keySub, "key m1", EventSnapshot, "a", "b")
	chainSub, err := e.Subscribe(context.Background(), ChainOf("model-to-addresses", "m1"))
	must(t, err)
	defer chainSub.Close()
	want(t, chainSub, "chain m1", EventSnapshot, "10.0.0.1", "10.0.0.2")
	indexSub, err := e.Subscribe(context.Background(), IndexOf("app-to-addresses"))
	must(t, err)
	defer indexSub.Close()
	if got := drainIndex(t, indexSub); !slices.Equal(got, []string{"snapshot a=10.0.0.1", "snapshot b=10.0.0.2", "synced"}) {
		t.Fatalf("index subscription: %q", got)
	}

	cfg2 := &schema.Config{Resources: []schema.Resource{appsResource(), slicesResource(), podsResource()}, Chains: []schema.Chain{routingChain}}
	changes := reloadTo(t, e, cfg2)
	if !slices.Equal(changes.Keep, []string{"apps", "slices"}) || !slices.Equal(changes.Start, []string{"pods"}) ||
		len(changes.Restart)+len(changes.Stop)+len(changes.ChainsAdded)+len(changes.ChainsChanged)+len(changes.ChainsRemoved) != 0 {
		t.Fatalf("changes = %+v", changes)
	}

	// Kept: the same watchers and answers, nothing for their subscribers.
	after, _ := e.view()
	for _, name := range []string{"apps", "slices"} {
		if after.byName[name] != before.byName[name] {
			t.Fatalf("watcher of %s replaced by a reload that keeps it", name)
		}
	}
	if got := e.Lookup("model-to-app", "m1"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("model-to-app m1 = %v", got)
	}
	if got := e.Lookup("model-to-app", "m2"); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("model-to-app m2 = %v", got)
	}
	if got := e.Resolve("model-to-addresses", "m1"); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Fatalf("chain m1 = %v", got)
	}
	quiet(t, keySub, "key subscription on a kept index")
	quiet(t, chainSub, "chain subscription on kept indexes")
	quiet(t, indexSub, "index subscription on a kept index")

	// Added: there, empty, not synced; Syncing, and the engine stays ready.
	if !e.Inspect().HasIndex("node-to-pod") || e.Lookup("node-to-pod", "n1") != nil || len(e.Keys("node-to-pod")) != 0 {
		t.Fatalf("added index: HasIndex %v, n1 = %v, keys %v", e.Inspect().HasIndex("node-to-pod"), e.Lookup("node-to-pod", "n1"), e.Keys("node-to-pod"))
	}
	if e.Inspect().IndexSynced("node-to-pod") {
		t.Fatal("the added index is synced before its first list")
	}
	if st := statusOf(t, e, "pods"); !st.Syncing || st.Ready || st.Synced {
		t.Fatalf("pods before its first list: %+v", st)
	}
	if st := statusOf(t, e, "apps"); st.Syncing || !st.Ready {
		t.Fatalf("apps, kept: %+v", st)
	}
	if !e.Ready() {
		t.Fatal("a resource still syncing after a reload made the engine unready")
	}
	podSub, err := e.Subscribe(context.Background(), KeyOf("node-to-pod", "n1"))
	must(t, err)
	defer podSub.Close()
	quiet(t, podSub, "subscription on the added index before its first list")

	list(t, e, "pods", podJSON("p1", "n1"), podJSON("p2", "n2"))
	if got := e.Lookup("node-to-pod", "n1"); !slices.Equal(got, []string{"p1"}) {
		t.Fatalf("node-to-pod n1 = %v after the first list", got)
	}
	if st := statusOf(t, e, "pods"); st.Syncing || !st.Ready || !st.Synced || st.Objects != 2 {
		t.Fatalf("pods after its first list: %+v", st)
	}
	if !e.Inspect().IndexSynced("node-to-pod") || !e.Inspect().Synced() || !e.Ready() {
		t.Fatalf("after the first list: IndexSynced %v, Synced %v, Ready %v", e.Inspect().IndexSynced("node-to-pod"), e.Inspect().Synced(), e.Ready())
	}
	want(t, podSub, "added index after its first list", EventSnapshot, "p1")
	quiet(t, keySub, "key subscription on a kept index, after the added one listed")
}

// TestReloadRestartChangedKeepsAnswers proves that a resource whose index
// rule changed restarts alone and keeps answering from its old definition
// until the new watcher's first list, which changes only the keys whose
// answer differs: each subscriber hears once of each such key, and of
// nothing else.
func TestReloadRestartChangedKeepsAnswers(t *testing.T) {
	cfg := &schema.Config{Resources: []schema.Resource{appsResource(), slicesResource()}, Chains: []schema.Chain{routingChain}}
	e := testEngine(t, cfg)
	objs := [][]byte{appPrimaryJSON("a", "m1", "m1", "m2"), appPrimaryJSON("b", "m1", "m1"), appPrimaryJSON("c", "m2", "m3")}
	list(t, e, "apps", objs...)
	list(t, e, "slices", sliceJSON("a-1", "a", "10.0.0.1"), sliceJSON("c-1", "c", "10.0.0.3"))
	before, _ := e.view()
	// By models: m1 -> a b, m2 -> a, m3 -> c. By primary: m1 -> a b, m2 -> c.
	subs := map[string]*Subscription{}
	for _, m := range []string{"m1", "m2", "m3", "m4"} {
		s, err := e.Subscribe(context.Background(), KeyOf("model-to-app", m))
		must(t, err)
		defer s.Close()
		next(t, s)
		subs[m] = s
	}
	chainM1, err := e.Subscribe(context.Background(), ChainOf("model-to-addresses", "m1"))
	must(t, err)
	defer chainM1.Close()
	want(t, chainM1, "chain m1", EventSnapshot, "10.0.0.1")
	chainM3, err := e.Subscribe(context.Background(), ChainOf("model-to-addresses", "m3"))
	must(t, err)
	defer chainM3.Close()
	want(t, chainM3, "chain m3", EventSnapshot, "10.0.0.3")
	indexSub, err := e.Subscribe(context.Background(), IndexOf("model-to-app"))
	must(t, err)
	defer indexSub.Close()
	drainIndex(t, indexSub)

	apps := appsResource()
	apps.Indexes[0].Key = "spec.primary"
	changes := reloadTo(t, e, &schema.Config{Resources: []schema.Resource{apps, slicesResource()}, Chains: []schema.Chain{routingChain}})
	if !slices.Equal(changes.Restart, []string{"apps"}) || !slices.Equal(changes.Keep, []string{"slices"}) {
		t.Fatalf("changes = %+v", changes)
	}
	after, _ := e.view()
	if after.byName["apps"] == before.byName["apps"] || after.byName["slices"] != before.byName["slices"] {
		t.Fatal("want a new watcher for apps only")
	}

	// Before the new watcher's first list: the old answers, synced.
	for m, vals := range map[string][]string{"m1": {"a", "b"}, "m2": {"a"}, "m3": {"c"}} {
		if got := e.Lookup("model-to-app", m); !slices.Equal(got, vals) {
			t.Fatalf("before the first list, %s = %v, want the old answer %v", m, got, vals)
		}
	}
	if !e.Inspect().IndexSynced("model-to-app") || !e.Inspect().ChainSynced("model-to-addresses") {
		t.Fatal("the restarted resource's index is not synced before its first list")
	}
	if st := statusOf(t, e, "apps"); !st.Syncing || !st.Synced || !st.Ready || st.Relists != 1 {
		t.Fatalf("apps before its first list: %+v", st)
	}
	if !e.Ready() {
		t.Fatal("engine not ready while a changed resource syncs")
	}
	for m, s := range subs {
		quiet(t, s, "key "+m+" before the first list")
	}
	quiet(t, chainM1, "chain m1 before the first list")
	quiet(t, chainM3, "chain m3 before the first list")
	quiet(t, indexSub, "index subscription before the first list")

	// The first list with the new rule changes m2 and m3 only.
	list(t, e, "apps", objs...)
	for m, vals := range map[string][]string{"m1": {"a", "b"}, "m2": {"c"}, "m3": nil} {
		if got := e.Lookup("model-to-app", m); !slices.Equal(got, vals) {
			t.Fatalf("after the first list, %s = %v, want %v", m, got, vals)
		}
	}
	if st := statusOf(t, e, "apps"); st.Syncing || !st.Ready || st.Relists != 2 {
		t.Fatalf("apps after its first list: %+v", st)
	}
	quiet(t, subs["m1"], "key m1, whose answer did not change")
	quiet(t, subs["m4"], "key m4, never answered")
	want(t, subs["m2"], "key m2", EventUpdate, "c")
	quiet(t, subs["m2"], "key m2 after its update")
	want(t, subs["m3"], "key m3", EventUpdate)
	quiet(t, subs["m3"], "key m3 after its update")
	quiet(t, chainM1, "chain m1, whose answer did not change")
	want(t, chainM3, "chain m3", EventUpdate)
	if got := drainIndex(t, indexSub); !slices.Equal(got, []string{"update m2=c", "update m3="}) {
		t.Fatalf("index subscription after the first list: %q, want the updates of m2 and m3 only", got)
	}
}

// TestReloadRemovedIsGone proves that a removed resource takes its
// indexes and the chains through them away at once, and that every
// subscription on them (key, index, chain, and one still waiting for the
// first list) gets EventGone then ErrClosed, while the others hear
// nothing.
func TestReloadRemovedIsGone(t *testing.T) {
	cfg := &schema.Config{Resources: []schema.Resource{appsResource(), slicesResource(), podsResource()}, Chains: []schema.Chain{routingChain}}
	e := testEngine(t, cfg)
	list(t, e, "apps", appJSON("a", "m1"))
	list(t, e, "slices", sliceJSON("a-1", "a", "10.0.0.1"))
	// pods never lists: its subscription waits for the first list.
	handle, ok := e.Inspect().Index("app-to-addresses")
	if !ok || !slices.Equal(handle.Lookup("a"), []string{"10.0.0.1"}) {
		t.Fatalf("handle of app-to-addresses: %v %v", ok, handle.Lookup("a"))
	}

	keySub, err := e.Subscribe(context.Background(), KeyOf("app-to-addresses", "a"))
	must(t, err)
	want(t, keySub, "key a", EventSnapshot, "10.0.0.1")
	indexSub, err := e.Subscribe(context.Background(), IndexOf("app-to-addresses"))
	must(t, err)
	drainIndex(t, indexSub)
	chainSub, err := e.Subscribe(context.Background(), ChainOf("model-to-addresses", "m1"))
	must(t, err)
	want(t, chainSub, "chain m1", EventSnapshot, "10.0.0.1")
	otherSub, err := e.Subscribe(context.Background(), KeyOf("model-to-app", "m1"))
	must(t, err)
	defer otherSub.Close()
	want(t, otherSub, "key m1 of a kept index", EventSnapshot, "a")
	waiting, err := e.Subscribe(context.Background(), KeyOf("node-to-pod", "n1"))
	must(t, err)
	// A Next blocked in the wait for the first list when the reload comes.
	waited := make(chan Event, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ev, err := waiting.Next(ctx)
		if err != nil {
			ev = Event{Key: err.Error()}
		}
		waited <- ev
	}()
	time.Sleep(20 * time.Millisecond)
	open := e.Inspect().Subscriptions().Open

	changes := reloadTo(t, e, &schema.Config{Resources: []schema.Resource{appsResource()}})
	if !slices.Equal(changes.Stop, []string{"slices", "pods"}) || !slices.Equal(changes.ChainsRemoved, []string{"model-to-addresses"}) || !slices.Equal(changes.Keep, []string{"apps"}) {
		t.Fatalf("changes = %+v", changes)
	}
	for _, ix := range []string{"app-to-addresses", "node-to-pod"} {
		if e.Inspect().HasIndex(ix) || e.Lookup(ix, "a") != nil || e.Keys(ix) != nil || e.Inspect().IndexSynced(ix) {
			t.Fatalf("removed index %s: HasIndex %v, Lookup %v, Keys %v, synced %v", ix, e.Inspect().HasIndex(ix), e.Lookup(ix, "a"), e.Keys(ix), e.Inspect().IndexSynced(ix))
		}
		if _, err := e.Subscribe(context.Background(), KeyOf(ix, "a")); err == nil {
			t.Fatalf("Subscribe on the removed index %s: no error", ix)
		}
	}
	if got := handle.Lookup("a"); got != nil {
		t.Fatalf("a handle of the removed index still answers %v", got)
	}
	if e.Inspect().HasChain("model-to-addresses") || e.Resolve("model-to-addresses", "m1") != nil || e.Inspect().ChainSynced("model-to-addresses") {
		t.Fatal("the removed chain is still there")
	}
	if got := e.Indexes(); len(got) != 1 || got[0].Name != "model-to-app" {
		t.Fatalf("Indexes() = %+v", got)
	}
	if got := e.Chains(); len(got) != 0 {
		t.Fatalf("Chains() = %+v", got)
	}
	if got := e.Status(); len(got) != 1 || got[0].Name != "apps" {
		t.Fatalf("Status() = %+v", got)
	}

	select {
	case ev := <-waited:
		if ev.Type != EventGone {
			t.Fatalf("subscription waiting for the first list: %+v, want EventGone", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the subscription waiting for the removed resource's first list was not woken")
	}
	if ev, err := waiting.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("after EventGone: %+v, %v; want ErrClosed", ev, err)
	}
	gone(t, keySub, "key subscription on a removed index")
	gone(t, indexSub, "index subscription on a removed index")
	gone(t, chainSub, "chain subscription on a removed chain")
	quiet(t, otherSub, "key subscription on a kept index")
	if got := e.Inspect().Subscriptions().Open; got != open-4 {
		t.Fatalf("%d subscriptions open, want %d", got, open-4)
	}
	// The kept index still works and still notifies.
	must(t, (&Feed{e: e}).Apply("apps", appJSON("b", "m1")))
	want(t, otherSub, "key m1 after a write", EventUpdate, "a", "b")
}

// TestReloadChainSwitches proves that a chain whose indexes change
// follows its new steps at once: a subscriber hears of it only when the
// answer differs, and from then on follows the new steps, not the old.
func TestReloadChainSwitches(t *testing.T) {
	chain := func(indexes ...string) []schema.Chain { return []schema.Chain{{Name: "c", Indexes: indexes}} }
	resources := []schema.Resource{appsResource(), slicesResource(), servicesResource()}
	e := testEngine(t, &schema.Config{Resources: resources, Chains: chain("model-to-app", "app-to-addresses")})
	list(t, e, "apps", appJSON("a", "m1"), appJSON("b", "m2"))
	list(t, e, "slices", sliceJSON("a-1", "a", "10.0.0.1"), sliceJSON("b-1", "b", "10.0.0.2"))
	// The service of a has the address of its slice; b's does not.
	list(t, e, "services", serviceJSON("a-svc", "a", "10.0.0.1"), serviceJSON("b-svc", "b", "10.9.9.9"))
	same, err := e.Subscribe(context.Background(), ChainOf("c", "m1"))
	must(t, err)
	defer same.Close()
	want(t, same, "chain m1", EventSnapshot, "10.0.0.1")
	differs, err := e.Subscribe(context.Background(), ChainOf("c", "m2"))
	must(t, err)
	defer differs.Close()
	want(t, differs, "chain m2", EventSnapshot, "10.0.0.2")

	changes := reloadTo(t, e, &schema.Config{Resources: resources, Chains: chain("model-to-app", "app-to-vip")})
	if !slices.Equal(changes.ChainsChanged, []string{"c"}) || len(changes.Keep) != 3 {
		t.Fatalf("changes = %+v", changes)
	}
	if got := e.Chains(); len(got) != 1 || !slices.Equal(got[0].Indexes, []string{"model-to-app", "app-to-vip"}) {
		t.Fatalf("Chains() = %+v", got)
	}
	if got := e.Resolve("c", "m2"); !slices.Equal(got, []string{"10.9.9.9"}) {
		t.Fatalf("Resolve(c, m2) = %v", got)
	}
	want(t, differs, "chain m2, whose answer changed", EventUpdate, "10.9.9.9")
	quiet(t, differs, "chain m2 after its update")
	quiet(t, same, "chain m1, whose answer did not change")

	// The subscriptions follow the new steps only.
	must(t, (&Feed{e: e}).Apply("slices", sliceJSON("a-1", "a", "10.0.0.7")))
	quiet(t, same, "chain m1 after a write to the old step")
	must(t, (&Feed{e: e}).Apply("services", serviceJSON("a-svc", "a", "10.0.0.8")))
	want(t, same, "chain m1 after a write to the new step", EventUpdate, "10.0.0.8")
}

// TestReloadIndexMovesResource proves that a key subscription on an index
// that moves to another resource entry is rebound, not gone, and follows
// the index of its new resource.
func TestReloadIndexMovesResource(t *testing.T) {
	apps := appsResource()
	apps.Indexes = append(apps.Indexes, schema.Index{Name: "x", Key: "spec.models", Value: "apps:${metadata.name}"})
	e := testEngine(t, &schema.Config{Resources: []schema.Resource{apps, servicesResource()}})
	appObjs := [][]byte{appJSON("a", "m1")}
	svcObjs := [][]byte{serviceJSON("s", "a", "10.0.0.1"), []byte(`{"metadata":{"name":"t","labels":{"app":"a"}},"spec":{"vip":"10.0.0.2","models":["m1"]}}`)}
	list(t, e, "apps", appObjs...)
	list(t, e, "services", svcObjs...)
	oldHandle, _ := e.Inspect().Index("x")
	sub, err := e.Subscribe(context.Background(), KeyOf("x", "m1"))
	must(t, err)
	defer sub.Close()
	want(t, sub, "x m1", EventSnapshot, "apps:a")

	services := servicesResource()
	services.Indexes = append(services.Indexes, schema.Index{Name: "x", Key: "spec.models", Value: "services:${metadata.name}"})
	changes := reloadTo(t, e, &schema.Config{Resources: []schema.Resource{appsResource(), services}})
	if !slices.Equal(changes.Restart, []string{"apps", "services"}) {
		t.Fatalf("changes = %+v", changes)
	}
	if got := e.Indexes(); len(got) != 3 || got[2].Name != "x" || got[2].Resource != "services" {
		t.Fatalf("Indexes() = %+v", got)
	}
	if got := oldHandle.Lookup("m1"); got != nil {
		t.Fatalf("the handle of x in apps still answers %v", got)
	}
	list(t, e, "apps", appObjs...)
	list(t, e, "services", svcObjs...)
	if got := e.Lookup("x", "m1"); !slices.Equal(got, []string{"services:t"}) {
		t.Fatalf("x m1 = %v after services listed", got)
	}
	// The subscription is not gone: it ends up with x's new answer. (See
	// TestReloadMovedIndexNotSyncedBeforeItsList for what it hears between
	// the reload and the list.)
	for {
		ev := next(t, sub)
		if ev.Type == EventGone {
			t.Fatal("a subscription on a moved index is gone")
		}
		if ev.Type != EventUpdate {
			t.Fatalf("x m1: %+v, want updates", ev)
		}
		if slices.Equal(ev.Values, []string{"services:t"}) {
			break
		}
	}
	quiet(t, sub, "x m1 after its new answer")
	must(t, (&Feed{e: e}).Delete("services", "t"))
	want(t, sub, "x m1 after a delete in its new resource", EventUpdate)
}

// TestReloadMovedIndexNotSyncedBeforeItsList: an index new to a resource
// that a reload restarts (an index added to it, or moved to it from
// another resource) starts empty, so until the resource's first list with
// its new definition an empty answer means "not known yet": the index must
// not read as synced, and a subscriber on it must not be told that the
// key has no values.
func TestReloadMovedIndexNotSyncedBeforeItsList(t *testing.T) {
	apps := appsResource()
	apps.Indexes = append(apps.Indexes, schema.Index{Name: "x", Key: "spec.models", Value: "apps:${metadata.name}"})
	e := testEngine(t, &schema.Config{Resources: []schema.Resource{apps, servicesResource()}})
	list(t, e, "apps", appJSON("a", "m1"))
	list(t, e, "services", []byte(`{"metadata":{"name":"t","labels":{"app":"a"}},"spec":{"vip":"10.0.0.2","models":["m1"]}}`))
	sub, err := e.Subscribe(context.Background(), KeyOf("x", "m1"))
	must(t, err)
	defer sub.Close()
	want(t, sub, "x m1", EventSnapshot, "apps:a")

	services := servicesResource()
	services.Indexes = append(services.Indexes,
		schema.Index{Name: "x", Key: "spec.models", Value: "services:${metadata.name}"},
		schema.Index{Name: "y", Key: "spec.models", Value: "metadata.name"})
	reloadTo(t, e, &schema.Config{Resources: []schema.Resource{appsResource(), services}})
	for _, ix := range []string{"x", "y"} {
		if e.Inspect().IndexSynced(ix) {
			t.Errorf("index %s, new to the restarted resource services, reads synced before its first list (Lookup m1 = %v)", ix, e.Lookup(ix, "m1"))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if ev, err := sub.Next(ctx); err == nil {
		t.Errorf("x m1 before services listed: %v %v; a subscriber was told the key has no values before the resource listed", ev.Type, ev.Values)
	}
}

// TestReloadWindowBeforeTheHubMarks: between the publication of a reload
// that removes an index and the hub's marking of its subscriptions, a
// subscription with an undelivered change reads the new config, not the
// removed index emptied: it gets gone, never an empty update first.
func TestReloadWindowBeforeTheHubMarks(t *testing.T) {
	e := testEngine(t, &schema.Config{Resources: []schema.Resource{appsResource(), servicesResource()}})
	list(t, e, "apps", appJSON("a", "m1"))
	list(t, e, "services", serviceJSON("s", "a", "10.0.0.1"))
	sub, err := e.Subscribe(context.Background(), KeyOf("model-to-app", "m1"))
	must(t, err)
	defer sub.Close()
	want(t, sub, "snapshot", EventSnapshot, "a")
	must(t, (&Feed{e: e}).Apply("apps", appJSON("b", "m1"))) // not delivered yet: [a b]

	var inWindow Event
	testHookPublished = func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		inWindow, err = sub.Next(ctx)
	}
	defer func() { testHookPublished = nil }()
	reloadTo(t, e, &schema.Config{Resources: []schema.Resource{servicesResource()}})
	if err != nil || inWindow.Type != EventGone {
		t.Fatalf("in the window: %v %v %v, want gone", inWindow.Type, inWindow.Values, err)
	}
	if _, err := sub.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("after gone: %v, want ErrClosed", err)
	}
}

// TestReloadAddedFallbackNotSyncedBeforeItsList: an index that a reload
// gives a fallback answers through it, so it reads synced only once its
// resource has listed again: until then the fallback is empty, and a key
// that only it serves would read "no values" as if known.
func TestReloadAddedFallbackNotSyncedBeforeItsList(t *testing.T) {
	e := testEngine(t, &schema.Config{Resources: []schema.Resource{slicesResource()}})
	list(t, e, "slices", []byte(`{"metadata":{"name":"s","labels":{"app":"a"}},"addresses":["10.0.0.1"],"terminating":["10.0.0.9"]}`))
	if !e.Inspect().IndexSynced("app-to-addresses") {
		t.Fatal("not synced after the list")
	}
	next := slicesResource()
	next.Indexes[0].Fallback = "terminating"
	reloadTo(t, e, &schema.Config{Resources: []schema.Resource{next}})
	if e.Inspect().IndexSynced("app-to-addresses") {
		t.Errorf("synced before the list that fills its new fallback")
	}
	list(t, e, "slices", []byte(`{"metadata":{"name":"s","labels":{"app":"b"}},"terminating":["10.0.0.9"]}`))
	if !e.Inspect().IndexSynced("app-to-addresses") || !slices.Equal(e.Lookup("app-to-addresses", "b"), []string{"10.0.0.9"}) {
		t.Errorf("after the list: synced %v, b = %v", e.Inspect().IndexSynced("app-to-addresses"), e.Lookup("app-to-addresses", "b"))
	}
}
