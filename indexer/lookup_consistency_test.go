package indexer

import (
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// TestNewIndexWithFallbackNeverEmpty: Reconfigures add and remove index
// "a", whose fallback "b" exists throughout and holds k, while a reader
// takes a's handle from the current snapshot and looks k up at once.
// Every state that has "a" answers b's values: the reader must never see
// k empty while "a" is live under the handle's id, even while the
// Reconfigure that adds it is still publishing (many indexes before it
// make that publication long).
func TestNewIndexWithFallbackNeverEmpty(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // both cores for the writer and the reader
	pad := make([]string, 1000)
	for i := range pad {
		pad[i] = fmt.Sprintf("pad-%d", i)
	}
	without := []SourceSpec{{Name: "pad", Indexes: pad}, {Name: "s", Indexes: []string{"b"}}}
	with := []SourceSpec{{Name: "pad", Indexes: pad}, {Name: "s", Indexes: []string{"a", "b"}, Fallbacks: map[string]string{"a": "b"}}}
	s, err := New(without...)
	if err != nil {
		t.Fatal(err)
	}
	put := func() {
		tx := s.Source("s").Begin()
		tx.Put(Object{Key: "o", Entries: [][]Entry{{{Key: "k", Value: "v"}}}})
		tx.Commit()
	}
	put()
	var stop atomic.Bool
	var bad, good atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			ix, ok := s.Index("a")
			if !ok {
				continue
			}
			got := ix.Lookup("k")
			if id, live := s.Snapshot().conf.names["a"]; live && id == ix.id {
				if slices.Equal(got, []string{"v"}) {
					good.Add(1)
				} else {
					bad.Add(1)
				}
			}
		}
	})
	for i := range 60 {
		specs := without
		if i%2 == 0 {
			specs = with
		}
		if _, err := s.Reconfigure(specs, nil); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			put() // b holds k in either layout
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("lookups checked: %d answered [v], %d did not", good.Load(), bad.Load())
	if bad.Load() > 0 {
		t.Fatalf("%d lookups of a live index with a fallback answered nothing; every state answers [v]", bad.Load())
	}
}

// TestLookupReadsOneCommit: a lookup by handle reads the index's state
// and whether it has a fallback with one load, so a reader descheduled
// after that load answers as of one commit, whatever commits land before
// it goes on: here a Reconfigure that gives "a" the fallback "b", then a
// write that moves k's values from a to b. Every state answers [1].
func TestLookupReadsOneCommit(t *testing.T) {
	s, err := New(SourceSpec{Name: "s", Indexes: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	put := func(own, fallback []Entry) {
		tx := s.Source("s").Begin()
		tx.Put(Object{Key: "o", Entries: [][]Entry{own, fallback}})
		tx.Commit()
	}
	put([]Entry{{Key: "k", Value: "1"}}, nil)
	ix, _ := s.Index("a")
	is := ix.head.Load() // what Index.Lookup loads first
	if _, err := s.Reconfigure([]SourceSpec{{Name: "s", Indexes: []string{"a", "b"}, Fallbacks: map[string]string{"a": "b"}}}, nil); err != nil {
		t.Fatal(err)
	}
	put(nil, []Entry{{Key: "k", Value: "1"}})
	if got := ix.Lookup("k"); !slices.Equal(got, []string{"1"}) {
		t.Fatalf("after both commits: %v, want [1]", got)
	}
	// The rest of Index.Lookup, on what it loaded before the commits.
	var got []string
	if !is.served && is != emptyIndex {
		got = is.values.lookup(ix.seed, "k")
	} else {
		got = s.current.Load().Lookup(ix, "k")
	}
	if !slices.Equal(got, []string{"1"}) {
		t.Fatalf("a lookup across the two commits answered %v; every state answers [1]", got)
	}
}
