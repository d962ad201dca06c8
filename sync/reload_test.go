package sync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

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
func list(tb testing.TB, e *Engine, resource string, objs ...[]byte) *watcher {
	tb.Helper()
	v, _ := e.view()
	r := v.byName[resource]
	if r == nil {
		tb.Fatalf("no watcher of resource %q", resource)
	}
	w := r.lead()
	items := make([]any, len(objs))
	for i, o := range objs {
		items[i] = w.project(string(o))
	}
	must(tb, w.replace(items, ""))
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
	if !e.HasIndex("node-to-pod") || e.Lookup("node-to-pod", "n1") != nil || len(e.Keys("node-to-pod")) != 0 {
		t.Fatalf("added index: HasIndex %v, n1 = %v, keys %v", e.HasIndex("node-to-pod"), e.Lookup("node-to-pod", "n1"), e.Keys("node-to-pod"))
	}
	if e.IndexSynced("node-to-pod") {
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
	if !e.IndexSynced("node-to-pod") || !e.Synced() || !e.Ready() {
		t.Fatalf("after the first list: IndexSynced %v, Synced %v, Ready %v", e.IndexSynced("node-to-pod"), e.Synced(), e.Ready())
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
	if !e.IndexSynced("model-to-app") || !e.ChainSynced("model-to-addresses") {
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
	handle, ok := e.Index("app-to-addresses")
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
	open := e.Subscriptions().Open

	changes := reloadTo(t, e, &schema.Config{Resources: []schema.Resource{appsResource()}})
	if !slices.Equal(changes.Stop, []string{"slices", "pods"}) || !slices.Equal(changes.ChainsRemoved, []string{"model-to-addresses"}) || !slices.Equal(changes.Keep, []string{"apps"}) {
		t.Fatalf("changes = %+v", changes)
	}
	for _, ix := range []string{"app-to-addresses", "node-to-pod"} {
		if e.HasIndex(ix) || e.Lookup(ix, "a") != nil || e.Keys(ix) != nil || e.IndexSynced(ix) {
			t.Fatalf("removed index %s: HasIndex %v, Lookup %v, Keys %v, synced %v", ix, e.HasIndex(ix), e.Lookup(ix, "a"), e.Keys(ix), e.IndexSynced(ix))
		}
		if _, err := e.Subscribe(context.Background(), KeyOf(ix, "a")); err == nil {
			t.Fatalf("Subscribe on the removed index %s: no error", ix)
		}
	}
	if got := handle.Lookup("a"); got != nil {
		t.Fatalf("a handle of the removed index still answers %v", got)
	}
	if e.HasChain("model-to-addresses") || e.Resolve("model-to-addresses", "m1") != nil || e.ChainSynced("model-to-addresses") {
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
	if got := e.Subscriptions().Open; got != open-4 {
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
	oldHandle, _ := e.Index("x")
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
		if e.IndexSynced(ix) {
			t.Errorf("index %s, new to the restarted resource services, reads synced before its first list (Lookup m1 = %v)", ix, e.Lookup(ix, "m1"))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if ev, err := sub.Next(ctx); err == nil {
		t.Errorf("x m1 before services listed: %v %v; a subscriber was told the key has no values before the resource listed", ev.Type, ev.Values)
	}
}

// --- the model test ---

// reloadWorld is the fixed material of TestReloadModelConcurrentReaders:
// configs over a pool of resources, indexes and chains, and the objects
// of each resource.
type reloadWorld struct {
	configs []*schema.Config
	objects map[string]map[string][]byte // resource -> object name -> JSON
	tokens  []string                     // every key an index may have
	indexes []string                     // the pool of index names
	chains  []string                     // the pool of chain names
	// What each config shows, for the readers: per chain, the last index
	// it has in some config; and the signatures of Indexes(), Chains() and
	// Status() of each config.
	lastOf                            map[string]map[string]bool
	indexSigs, chainSigs, resourceSig map[string]bool
}

func newReloadWorld(rng *rand.Rand) *reloadWorld {
	w := &reloadWorld{
		objects: map[string]map[string][]byte{}, lastOf: map[string]map[string]bool{},
		indexSigs: map[string]bool{}, chainSigs: map[string]bool{}, resourceSig: map[string]bool{},
	}
	resources := []string{"r0", "r1", "r2", "r3", "r4"}
	for i := range 8 {
		w.indexes = append(w.indexes, fmt.Sprintf("i%d", i))
	}
	for i := range 4 {
		w.chains = append(w.chains, fmt.Sprintf("c%d", i))
	}
	// An index's values are "index:name" or "index:tag"; its keys come
	// from refs or alt, drawn from these and from a few plain keys.
	objectNames := []string{"o0", "o1", "o2", "o3"}
	tags := []string{"t0", "t1", "t2"}
	w.tokens = []string{"k0", "k1", "k2", "k3"}
	for _, ix := range w.indexes {
		for _, s := range append(slices.Clone(objectNames), tags...) {
			w.tokens = append(w.tokens, ix+":"+s)
		}
	}
	pick := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = w.tokens[rng.IntN(len(w.tokens))]
		}
		return out
	}
	for _, r := range resources {
		w.objects[r] = map[string][]byte{}
		for _, name := range objectNames {
			w.objects[r][name] = w.object(rng, name, pick)
		}
	}
	for range 8 {
		cfg := &schema.Config{}
		rs := slices.Clone(resources)
		rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
		rs = rs[:3+rng.IntN(2)]
		names := slices.Clone(w.indexes)
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		var all []string
		for _, r := range rs {
			res := schema.Resource{Name: r, Version: "v1", Resource: r + "s"}
			if rng.IntN(4) == 0 {
				res.LabelSelector = "tier=a"
			}
			if rng.IntN(3) == 0 {
				res.Fields = map[string]string{"tag": "spec.tag", "name": "metadata.name"}
			}
			for range 1 + rng.IntN(2) {
				ix := schema.Index{Name: names[0], Key: "spec.refs", Value: names[0] + ":${metadata.name}"}
				names = names[1:]
				if rng.IntN(2) == 0 {
					ix.Key = "spec.alt"
				}
				if rng.IntN(2) == 0 {
					ix.Value = ix.Name + ":${spec.tag}"
				}
				res.Indexes = append(res.Indexes, ix)
				all = append(all, ix.Name)
			}
			cfg.Resources = append(cfg.Resources, res)
		}
		for _, c := range w.chains {
			if rng.IntN(3) == 0 {
				continue
			}
			steps := slices.Clone(all)
			rng.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
			cfg.Chains = append(cfg.Chains, schema.Chain{Name: c, Indexes: steps[:2+rng.IntN(2)]})
		}
		w.add(cfg)
	}
	return w
}

// object makes the JSON of one object.
func (w *reloadWorld) object(rng *rand.Rand, name string, pick func(int) []string) []byte {
	tier := "a"
	if rng.IntN(2) == 0 {
		tier = "b"
	}
	b, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"name": name, "labels": map[string]string{"tier": tier}},
		"spec":     map[string]any{"refs": pick(6), "alt": pick(6), "tag": fmt.Sprintf("t%d", rng.IntN(3))},
	})
	return b
}

// add records a config and what it shows.
func (w *reloadWorld) add(cfg *schema.Config) {
	w.configs = append(w.configs, cfg)
	var ixSig, chSig, resSig []string
	for _, r := range cfg.Resources {
		resSig = append(resSig, r.Name)
		for _, ix := range r.Indexes {
			ixSig = append(ixSig, ix.Name+"@"+r.Name)
		}
	}
	for _, c := range cfg.Chains {
		chSig = append(chSig, c.Name+"="+strings.Join(c.Indexes, ">"))
		if w.lastOf[c.Name] == nil {
			w.lastOf[c.Name] = map[string]bool{}
		}
		w.lastOf[c.Name][c.Indexes[len(c.Indexes)-1]] = true
	}
	slices.Sort(ixSig)
	slices.Sort(chSig)
	w.indexSigs[strings.Join(ixSig, " ")] = true
	w.chainSigs[strings.Join(chSig, " ")] = true
	w.resourceSig[strings.Join(resSig, " ")] = true
}

// objectsOf returns the objects of a resource, in name order.
func (w *reloadWorld) objectsOf(resource string) [][]byte {
	var out [][]byte
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range w.objects[resource] {
			if !yield(k) {
				return
			}
		}
	}) {
		out = append(out, w.objects[resource][name])
	}
	return out
}

// observe describes everything a reader can see of e.
func observe(e *Engine) string {
	var b strings.Builder
	for _, st := range e.Status() {
		fmt.Fprintf(&b, "resource %s objects=%d synced=%v syncing=%v ready=%v\n", st.Name, st.Objects, st.Synced, st.Syncing, st.Ready)
		if fields, err := e.ResourceFields(st.Name); err == nil {
			for _, f := range fields {
				fmt.Fprintf(&b, "  fields %s %s\n", f.Key, f.JSON)
			}
		}
	}
	for _, ix := range e.Indexes() {
		fmt.Fprintf(&b, "index %+v\n", ix)
		for _, k := range e.Keys(ix.Name) {
			fmt.Fprintf(&b, "  %s = %v\n", k, e.Lookup(ix.Name, k))
			if fields, err := e.IndexFields(ix.Name, k); err == nil {
				fmt.Fprintf(&b, "    objects %v\n", fields)
			}
		}
	}
	for _, ch := range e.Chains() {
		fmt.Fprintf(&b, "chain %+v\n", ch)
		for _, k := range e.Keys(ch.Indexes[0]) {
			fmt.Fprintf(&b, "  %s -> %v\n", k, e.Resolve(ch.Name, k))
		}
	}
	return b.String()
}

// firstDiff returns the first line where a and b differ.
func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(la), len(lb)) {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n  reloaded: %s\n  fresh:    %s", i+1, x, y)
		}
	}
	return ""
}

// TestReloadModelConcurrentReaders reloads an engine ~100 times between
// random configs (resources, indexes moving between them, rules,
// selectors, fields and chains changing), with writes in between, and
// proves that:
//   - after each reload and the first lists of what it started or
//     restarted, the engine shows exactly what a fresh engine of the same
//     config fed the same objects shows: nothing lost, no ghosts;
//   - meanwhile, readers on other goroutines only ever see one config at
//     a time: a view whose chains' steps are the live indexes of its
//     snapshot, Indexes(), Chains() and Status() of one config, and index
//     and chain answers that some config could give. Run it with -race.
func TestReloadModelConcurrentReaders(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	world := newReloadWorld(rng)
	e := testEngine(t, world.configs[0])
	feed := func(e *Engine, all bool) {
		v, _ := e.view()
		for _, w := range v.watchers {
			if all || !w.listed1() {
				list(t, e, w.plan.Name, world.objectsOf(w.plan.Name)...)
			}
		}
	}
	feed(e, true)

	var failures atomic.Int64
	fail := func(format string, args ...any) {
		if failures.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	stop := make(chan struct{})
	var readers gosync.WaitGroup
	var reads atomic.Int64
	for r := range 4 {
		readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 99))
			for {
				select {
				case <-stop:
					return
				default:
				}
				reads.Add(1)
				// One view: its chains over live indexes of its snapshot.
				v, snap := e.view()
				if len(v.chains) != len(v.plan.Chains) {
					fail("a view with %d chains published for a plan of %d", len(v.chains), len(v.plan.Chains))
				}
				for name, ch := range v.chains {
					if len(ch.steps) != len(ch.indexes) {
						fail("chain %s: %d steps for %d indexes", name, len(ch.steps), len(ch.indexes))
						continue
					}
					for i, ixName := range ch.indexes {
						ix, ok := snap.Index(ixName)
						if !ok || ix != ch.steps[i] {
							fail("chain %s step %d: %s is not a live index of the view's snapshot (found %v)", name, i, ixName, ok)
						}
					}
				}
				for name := range v.byIndex {
					if _, ok := snap.Index(name); !ok {
						fail("index %s of the view is not in its snapshot", name)
					}
				}
				for _, w := range v.watchers {
					if w.src == nil {
						fail("watcher %s of a published view has no source", w.plan.Name)
					}
				}

				// Each reader call sees one config.
				var sig []string
				for _, ix := range e.Indexes() {
					sig = append(sig, ix.Name+"@"+ix.Resource)
				}
				if s := strings.Join(sig, " "); !world.indexSigs[s] {
					fail("Indexes() = %s: no config's", s)
				}
				sig = sig[:0]
				for _, ch := range e.Chains() {
					sig = append(sig, ch.Name+"="+strings.Join(ch.Indexes, ">"))
				}
				if s := strings.Join(sig, " "); !world.chainSigs[s] {
					fail("Chains() = %q: no config's", s)
				}
				sig = sig[:0]
				for _, st := range e.Status() {
					sig = append(sig, st.Name)
				}
				if s := strings.Join(sig, " "); !world.resourceSig[s] {
					fail("Status() of %q: no config's", s)
				}

				// Answers some config could give.
				for range 8 {
					ix := world.indexes[rng.IntN(len(world.indexes))]
					key := world.tokens[rng.IntN(len(world.tokens))]
					for _, val := range e.Lookup(ix, key) {
						if !strings.HasPrefix(val, ix+":") {
							fail("Lookup(%s, %s) has %q, a value of another index", ix, key, val)
						}
					}
					for _, k := range e.Keys(ix) {
						if !slices.Contains(world.tokens, k) {
							fail("Keys(%s) has %q", ix, k)
						}
					}
					_ = e.HasIndex(ix)
					_ = e.IndexSynced(ix)
					c := world.chains[rng.IntN(len(world.chains))]
					for _, val := range e.Resolve(c, key) {
						last, _, _ := strings.Cut(val, ":")
						if !world.lastOf[c][last] {
							fail("Resolve(%s, %s) has %q: %s is the last index of %s in no config", c, key, val, last, c)
						}
					}
					_ = e.HasChain(c)
					_ = e.ChainSynced(c)
				}
				_ = e.Ready()
				_ = e.Synced()
			}
		})
	}

	// A subscriber too: key and chain subscriptions that reloads rebind or
	// end, whose answers are always some config's.
	var events atomic.Int64
	readers.Go(func() {
		rng := rand.New(rand.NewPCG(5, 99))
		var sub *Subscription
		var target Target
		defer func() {
			if sub != nil {
				sub.Close()
			}
		}()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if sub == nil {
				key := world.tokens[rng.IntN(len(world.tokens))]
				target = KeyOf(world.indexes[rng.IntN(len(world.indexes))], key)
				if rng.IntN(2) == 0 {
					target = ChainOf(world.chains[rng.IntN(len(world.chains))], key)
				}
				s, err := e.Subscribe(context.Background(), target)
				if err != nil {
					continue // not in the current config
				}
				sub = s
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			ev, err := sub.Next(ctx)
			cancel()
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				if rng.IntN(4) == 0 { // and take a new one
					sub.Close()
					sub = nil
				}
				continue
			case err != nil:
				fail("subscription %+v: %v", target, err)
				sub.Close()
				sub = nil
				continue
			case ev.Type == EventGone:
				if _, err := sub.Next(context.Background()); !errors.Is(err, ErrClosed) {
					fail("subscription %+v: after EventGone: %v, want ErrClosed", target, err)
				}
				sub = nil
				continue
			}
			events.Add(1)
			for _, val := range ev.Values {
				last, _, _ := strings.Cut(val, ":")
				if target.Chain != "" && !world.lastOf[target.Chain][last] || target.Index != "" && last != target.Index {
					fail("subscription %+v: %v %v: no config's answer", target, ev.Type, ev.Values)
				}
			}
		}
	})

	start := time.Now()
	reloads := 0
	for i := range 100 {
		cfg := world.configs[rng.IntN(len(world.configs))]
		plan, err := schema.Compile(cfg)
		must(t, err)
		if _, err := e.Reload(plan); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		reloads++
		feed(e, false)
		// A write now and then: an object of a live resource changes.
		if rng.IntN(3) == 0 {
			r := cfg.Resources[rng.IntN(len(cfg.Resources))].Name
			name := fmt.Sprintf("o%d", rng.IntN(4))
			obj := world.object(rng, name, func(n int) []string {
				out := make([]string, n)
				for i := range out {
					out[i] = world.tokens[rng.IntN(len(world.tokens))]
				}
				return out
			})
			world.objects[r][name] = obj
			v, _ := e.view()
			w := v.byName[r].lead()
			must(t, w.update(w.project(string(obj))))
		}

		fresh := testEngine(t, cfg)
		feed(fresh, true)
		if got, want := observe(e), observe(fresh); got != want {
			t.Fatalf("after reload %d (config %d), the engine differs from a fresh one at %s", i, slices.Index(world.configs, cfg), firstDiff(got, want))
		}
		if failures.Load() > 0 {
			break
		}
	}
	close(stop)
	readers.Wait()
	if n := e.Subscriptions().Open; n != 0 {
		t.Errorf("%d subscriptions open after the subscriber closed its own", n)
	}
	t.Logf("%d reloads in %v, %d reader rounds, %d subscription events", reloads, time.Since(start).Round(time.Millisecond), reads.Load(), events.Load())
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
	if !e.IndexSynced("app-to-addresses") {
		t.Fatal("not synced after the list")
	}
	next := slicesResource()
	next.Indexes[0].Fallback = "terminating"
	reloadTo(t, e, &schema.Config{Resources: []schema.Resource{next}})
	if e.IndexSynced("app-to-addresses") {
		t.Errorf("synced before the list that fills its new fallback")
	}
	list(t, e, "slices", []byte(`{"metadata":{"name":"s","labels":{"app":"b"}},"terminating":["10.0.0.9"]}`))
	if !e.IndexSynced("app-to-addresses") || !slices.Equal(e.Lookup("app-to-addresses", "b"), []string{"10.0.0.9"}) {
		t.Errorf("after the list: synced %v, b = %v", e.IndexSynced("app-to-addresses"), e.Lookup("app-to-addresses", "b"))
	}
}
