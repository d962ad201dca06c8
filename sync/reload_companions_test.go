package sync

import (
	"context"
	"encoding/json"
	"slices"
	gosync "sync"
	"testing"
	"time"

	"github.com/iidp/metasync/indexer"
	"github.com/iidp/metasync/schema"
)

// companionsConfig is one resource of endpoints, svc -> spec.v, with the
// fallback spec.f and the hints spec.h when asked.
func companionsConfig(fallback, hints bool) *schema.Config {
	ix := schema.Index{Name: "svc", Key: "metadata.name", Value: "spec.v"}
	if fallback {
		ix.Fallback = "spec.f"
	}
	if hints {
		ix.Hints = "spec.h"
	}
	return &schema.Config{Resources: []schema.Resource{{Name: "eps", Version: "v1", Resource: "eps", Indexes: []schema.Index{ix}}}}
}

func endpointsJSON(name string, spec map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": name}, "spec": spec})
	return b
}

// fallbackOnly is an engine of companionsConfig(true, false) whose key s1
// is answered by its fallback alone ([10.9.9.9]), its feed, and s1's object.
func fallbackOnly(t *testing.T) (*Engine, *Feed, []byte) {
	t.Helper()
	e := testEngine(t, companionsConfig(true, false))
	for _, w := range watchersOf(e) {
		must(t, w.Replace(nil, ""))
	}
	f := &Feed{e: e}
	obj := endpointsJSON("s1", map[string]any{"f": []string{"10.9.9.9"}})
	must(t, f.Apply("eps", obj))
	return e, f, obj
}

// syncedIndexSub is a subscription to the whole index svc, past its
// initial state.
func syncedIndexSub(t *testing.T, e *Engine) *Subscription {
	t.Helper()
	all, err := e.Subscribe(context.Background(), IndexOf("svc"))
	must(t, err)
	t.Cleanup(all.Close)
	for ev := next(t, all); ev.Type != EventSynced; ev = next(t, all) {
	}
	return all
}

// reloadAndRelist reloads e with cfg and lists obj again, as the watcher
// that the reload restarts does: the index's values do not change, so no
// commit names the key.
func reloadAndRelist(t *testing.T, e *Engine, f *Feed, cfg *schema.Config, obj []byte) {
	t.Helper()
	plan, err := schema.Compile(cfg)
	must(t, err)
	_, err = e.Reload(plan)
	must(t, err)
	must(t, f.Replace("eps", obj))
}

// waitFor takes events of sub until one answers want.
func waitFor(t *testing.T, sub *Subscription, what string, want []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("%s: no event answering %q after the reload (%v)", what, want, err)
		}
		if slices.Equal(ev.Values, want) || len(ev.Values) == 0 && len(want) == 0 && ev.Type == EventUpdate {
			return
		}
	}
}

// TestReloadDroppingHintsReachesSubscribers: a key subscription narrowed
// to a zone, on an index whose hints a reload takes away, gets the whole
// answer, though no commit names the key.
func TestReloadDroppingHintsReachesSubscribers(t *testing.T) {
	e := testEngine(t, companionsConfig(false, true))
	for _, w := range watchersOf(e) {
		must(t, w.Replace(nil, ""))
	}
	f := &Feed{e: e}
	obj := endpointsJSON("s1", map[string]any{"v": []string{"10.0.0.1", "10.0.0.2"}, "h": []string{"10.0.0.1\tzone=a", "10.0.0.2\tzone=b"}})
	must(t, f.Apply("eps", obj))
	sub, err := e.Subscribe(context.Background(), Target{Index: "svc", Key: "s1", At: Locality{Zone: "a"}})
	must(t, err)
	defer sub.Close()
	if ev := next(t, sub); !slices.Equal(ev.Values, []string{"10.0.0.1"}) {
		t.Fatalf("before the reload: %+v, want zone a's [10.0.0.1]", ev)
	}
	reloadAndRelist(t, e, f, companionsConfig(false, false), obj)
	waitFor(t, sub, "zone a", []string{"10.0.0.1", "10.0.0.2"})
}

// TestReloadDroppingFallbackReachesSubscribers: a key answered by its
// fallback alone; a reload takes the fallback away: key and index
// subscribers hear that the key answers nothing now.
func TestReloadDroppingFallbackReachesSubscribers(t *testing.T) {
	e, f, obj := fallbackOnly(t)
	key, err := e.Subscribe(context.Background(), KeyOf("svc", "s1"))
	must(t, err)
	defer key.Close()
	if ev := next(t, key); !slices.Equal(ev.Values, []string{"10.9.9.9"}) {
		t.Fatalf("before the reload: %+v, want the fallback's", ev)
	}
	all := syncedIndexSub(t, e)
	reloadAndRelist(t, e, f, companionsConfig(false, false), obj)
	waitFor(t, key, "key", nil)
	waitFor(t, all, "index", nil)
}

// TestSubscriberNeverAheadOfHooks: commits are published before their
// hooks run, and a hook may wait behind another source's. A reload's
// tail (hub.reconfigure) must not start new index subscriptions from the
// store's snapshot, ahead of the hooks: the late hook would send the
// subscriber a change it already holds, with an older version. Each event
// after Synced changes what the subscriber holds, and versions only grow.
func TestSubscriberNeverAheadOfHooks(t *testing.T) {
	e := testEngine(t, &schema.Config{Resources: []schema.Resource{
		{Name: "big", Version: "v1", Resource: "bigs", Indexes: []schema.Index{{Name: "bx", Key: "metadata.name", Value: "spec.v"}}},
		{Name: "small", Version: "v1", Resource: "smalls", Indexes: []schema.Index{{Name: "sx", Key: "metadata.name", Value: "spec.v"}}},
	}})
	for _, w := range watchersOf(e) {
		must(t, w.Replace(nil, ""))
	}
	f := &Feed{e: e}
	obj := func(v string) []byte { return endpointsJSON("k", map[string]any{"v": v}) }
	must(t, f.Apply("big", obj("v1")))
	held, gate := make(chan struct{}), make(chan struct{})
	var once gosync.Once
	e.store.OnCommit(func(prev, next *indexer.Snapshot, changes []indexer.Change) {
		if sx, _ := next.Index("sx"); len(changes) > 0 && changes[0].Index == sx {
			once.Do(func() { close(held); <-gate }) // small's hook, held
		}
		e.hub.commit(prev, next, changes)
	})
	go func() { _ = f.Apply("small", obj("x")) }()
	<-held
	bigDone := make(chan struct{})
	go func() { defer close(bigDone); _ = f.Apply("big", obj("v2")) }() // published; its hook queued
	for !slices.Equal(e.Lookup("bx", "k"), []string{"v2"}) {
		time.Sleep(time.Millisecond)
	}
	e.hub.reconfigure(e, nil)
	sub, err := e.Subscribe(context.Background(), IndexOf("bx"))
	must(t, err)
	defer sub.Close()
	holds := map[string][]string{}
	var synced string
	for ev := next(t, sub); ; ev = next(t, sub) {
		if ev.Type == EventSynced {
			synced = ev.Version
			break
		}
		holds[ev.Key] = ev.Values
	}
	close(gate)
	<-bigDone
	last := e.versionSeq(t, synced)
	for !slices.Equal(holds["k"], []string{"v2"}) {
		ev := next(t, sub)
		if slices.Equal(holds[ev.Key], ev.Values) {
			t.Fatalf("%+v: the subscriber holds these values already", ev)
		}
		if seq := e.versionSeq(t, ev.Version); seq < last {
			t.Fatalf("%+v: version %d after %d", ev, seq, last)
		}
		holds[ev.Key] = ev.Values
	}
	noEvent(t, sub)
}

// versionSeq is the snapshot sequence of a subscription's version.
func (e *Engine) versionSeq(t *testing.T, version string) uint64 {
	t.Helper()
	seq, _, ok := e.parseVersion(version)
	if !ok {
		t.Fatalf("version %q does not parse", version)
	}
	return seq
}
