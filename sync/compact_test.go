package sync

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestCompactIsSilent: Compact sends no subscriber an event, later writes
// reach every kind of subscription as before, and neither the hub nor an
// idle index subscription keeps a snapshot from before Compact (which
// would keep every page it replaced in use).
func TestCompactIsSilent(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("apps", appJSON("a", "m1", "m2")))
	must(t, f.Apply("slices", sliceJSON("s1", "a", "10.0.0.1")))
	ctx := context.Background()
	index, err := e.Subscribe(ctx, IndexOf("model-to-app"))
	must(t, err)
	key, err := e.Subscribe(ctx, KeyOf("model-to-app", "m1"))
	must(t, err)
	chain, err := e.Subscribe(ctx, ChainOf("model-to-addresses", "m1"))
	must(t, err)
	for ev := next(t, index); ev.Type != EventSynced; ev = next(t, index) {
	}
	if ev := next(t, key); !slices.Equal(ev.Values, []string{"a"}) {
		t.Fatalf("key: %+v", ev)
	}
	if ev := next(t, chain); !slices.Equal(ev.Values, []string{"10.0.0.1"}) {
		t.Fatalf("chain: %+v", ev)
	}
	must(t, f.Apply("apps", appJSON("b", "m3")))
	if ev := next(t, index); ev.Key != "m3" {
		t.Fatalf("index: %+v", ev)
	}
	// Enough writes for Compact to be worth it (a quarter of the pages,
	// at least 64), each undone: no subscriber hears of them.
	for range 40 {
		must(t, f.Apply("apps", appJSON("b", "m3", "m4")))
		must(t, f.Apply("apps", appJSON("b", "m3")))
	}
	for { // m4 may come and go, or be coalesced away
		ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := index.Next(ctx)
		cancel()
		if err != nil {
			break
		}
	}

	writes := e.Inspect().Writes()
	if !e.Inspect().Compact() || e.Inspect().Compact() {
		t.Fatal("Compact: want true after writes, then false")
	}
	if e.Inspect().Writes() != writes {
		t.Fatalf("Compact counted as a write: %d → %d", writes, e.Inspect().Writes())
	}
	for _, s := range []*Subscription{index, key, chain} {
		noEvent(t, s)
	}
	if e.hub.latest != e.store.Snapshot() {
		t.Fatal("the hub keeps the snapshot from before Compact")
	}
	index.nextMu.Lock()
	index.mu.Lock()
	held := index.batch != nil || index.pendAt != nil || index.base != nil
	index.mu.Unlock()
	index.nextMu.Unlock()
	if held {
		t.Fatal("an idle index subscription keeps a snapshot it has delivered")
	}

	must(t, f.Apply("apps", appJSON("c", "m1")))
	must(t, f.Apply("slices", sliceJSON("s2", "c", "10.0.0.2")))
	if ev := next(t, index); ev.Key != "m1" || !slices.Equal(ev.Values, []string{"a", "c"}) {
		t.Fatalf("index after Compact: %+v", ev)
	}
	for ev := next(t, key); !slices.Equal(ev.Values, []string{"a", "c"}); ev = next(t, key) {
	}
	for ev := next(t, chain); !slices.Equal(ev.Values, []string{"10.0.0.1", "10.0.0.2"}); ev = next(t, chain) {
	}
}
