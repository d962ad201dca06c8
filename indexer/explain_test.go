package indexer

import (
	"fmt"
	"testing"
)

// TestExplainDoesNotBlockWriters: while an explanation is in the middle
// of its read of the objects, a write to another source and a write to
// the explained source both commit and are seen; the explanation tells
// the state it started from, and the next one the state after the writes.
// With explanations under the writer lock, the writes waited for the
// explanation, which waited for them: the test hangs.
func TestExplainDoesNotBlockWriters(t *testing.T) {
	s, err := New(SourceSpec{Name: "a", Indexes: []string{"a"}}, SourceSpec{Name: "b", Indexes: []string{"b"}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.Source("a"), s.Source("b")
	objs := make([]Object, 1000)
	for i := range objs {
		objs[i] = Object{Key: fmt.Sprintf("ns/o-%04d", i), Entries: [][]Entry{{{Key: fmt.Sprintf("k-%d", i%10), Value: "v"}}}, Meta: Meta{Version: "1"}}
	}
	a.Replace(objs)
	ixA, _ := s.Index("a")
	ixB, _ := s.Index("b")

	write := func(src *Source, o Object) {
		tx := src.Begin()
		tx.Put(o)
		tx.Commit()
	}
	held := 0
	claimsHook = func() {
		held++
		done := make(chan struct{})
		go func() {
			defer close(done)
			write(b, Object{Key: "ns/b", Entries: [][]Entry{{{Key: "k", Value: "written"}}}})
			write(a, Object{Key: "ns/new", Entries: [][]Entry{{{Key: "k-0", Value: "new"}}}, Meta: Meta{Version: "2"}})
			// A write that moves records of the set the explanation reads:
			// a delete shifts a cluster back.
			tx := a.Begin()
			for i := 0; i < len(objs); i += 3 {
				tx.Delete(objs[i].Key)
			}
			tx.Commit()
		}()
		<-done
		if got := ixB.Lookup("k"); len(got) != 1 || got[0] != "written" {
			t.Errorf("b's write not visible during the explanation: %q", got)
		}
	}
	defer func() { claimsHook = nil }()

	var during map[string][]Claim
	s.Explain(func(x *Explainer) { during = x.Claims(ixA, []string{"k-0", "k-1"}) })
	if held != 1 {
		t.Fatalf("the hook ran %d times, want 1", held)
	}
	claimsHook = nil
	if n := len(during["k-0"]); n != 100 {
		t.Errorf("during the writes: k-0 has %d claims, want the 100 of the state explained", n)
	}
	for _, c := range during["k-0"] {
		if c.Object == "ns/new" || c.Meta.Version != "1" {
			t.Errorf("the explanation saw a later write: %+v", c)
		}
	}
	var after map[string][]Claim
	s.Explain(func(x *Explainer) { after = x.Claims(ixA, []string{"k-0"}) })
	// k-0's objects are 0, 10, 20, ...; a third of them (every one whose
	// index is a multiple of 3: 0, 30, 60, ...) are deleted; ns/new came.
	if n, want := len(after["k-0"]), 100-34+1; n != want {
		t.Errorf("after the writes: k-0 has %d claims, want %d", n, want)
	}
}
