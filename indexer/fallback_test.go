package indexer

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// newTiered builds a store whose source "slices" feeds "ready" with the
// fallback "serving".
func newTiered(t testing.TB) (*Store, *Source, Index) {
	t.Helper()
	s, err := New(SourceSpec{Name: "slices", Indexes: []string{"ready", "serving"}, Objects: true, Fallbacks: map[string]string{"ready": "serving"}})
	if err != nil {
		t.Fatal(err)
	}
	ix, _ := s.Index("ready")
	return s, s.Source("slices"), ix
}

func putTiers(src *Source, key string, ready, serving []Entry) {
	tx := src.Begin()
	tx.Put(Object{Key: key, Entries: [][]Entry{ready, serving}})
	tx.Commit()
}

// TestFallback: a key answers its values in the index, else in its
// fallback, by name, by handle and on a snapshot; keys, key counts and
// objects follow what is answered.
func TestFallback(t *testing.T) {
	s, src, ix := newTiered(t)
	putTiers(src, "ns/a-1", []Entry{e("a", "10.0.0.1")}, []Entry{e("a", "10.0.0.9")})
	putTiers(src, "ns/b-1", nil, []Entry{e("b", "10.0.1.9")})
	putTiers(src, "ns/c-1", []Entry{e("c", "10.0.2.1")}, nil)

	snap := s.Snapshot()
	for key, want := range map[string][]string{"a": {"10.0.0.1"}, "b": {"10.0.1.9"}, "c": {"10.0.2.1"}, "d": nil} {
		if got := s.Lookup("ready", key); !slices.Equal(got, want) {
			t.Errorf("Store.Lookup(%s) = %v, want %v", key, got, want)
		}
		if got := ix.Lookup(key); !slices.Equal(got, want) {
			t.Errorf("Index.Lookup(%s) = %v, want %v", key, got, want)
		}
		if got := snap.Lookup(ix, key); !slices.Equal(got, want) {
			t.Errorf("Snapshot.Lookup(%s) = %v, want %v", key, got, want)
		}
	}
	if got := snap.Keys(ix); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("Keys = %v", got)
	}
	if n := snap.KeyCount(ix); n != 3 {
		t.Errorf("KeyCount = %d, want 3", n)
	}
	if got := snap.Objects(ix, "b"); !slices.Equal(got, []string{"ns/b-1"}) {
		t.Errorf("Objects(b) = %v", got)
	}
	if got := snap.Objects(ix, "a"); !slices.Equal(got, []string{"ns/a-1"}) {
		t.Errorf("Objects(a) = %v", got)
	}
	// The fallback is read through the index it serves only.
	if got := s.Lookup("serving", "a"); got != nil {
		t.Errorf("serving a = %v by its own name", got)
	}
	if _, ok := s.Index("serving"); ok {
		t.Error("a handle of the fallback by its name")
	}
	// Chains follow the answer of each step.
	if got := snap.Resolve([]Index{ix}, "b"); !slices.Equal(got, []string{"10.0.1.9"}) {
		t.Errorf("Resolve(b) = %v", got)
	}

	// The last ready value goes: the key answers its fallback.
	putTiers(src, "ns/a-1", nil, []Entry{e("a", "10.0.0.9"), e("a", "10.0.0.1")})
	if got := ix.Lookup("a"); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.9"}) {
		t.Errorf("a after terminating = %v", got)
	}
	src.Begin().Commit()
}

// TestFallbackChanges: a commit that changes only a fallback is reported
// as a change of the index it backs, once per key.
func TestFallbackChanges(t *testing.T) {
	s, src, ix := newTiered(t)
	var got [][]string
	s.OnCommit(func(_, _ *Snapshot, changes []Change) {
		for _, ch := range changes {
			if ch.Index.id != ix.id {
				t.Errorf("change of index %d, want only %d", ch.Index.id, ix.id)
			}
			keys := slices.Clone(ch.Keys)
			slices.Sort(keys)
			got = append(got, keys)
		}
	})
	putTiers(src, "ns/a-1", []Entry{e("a", "1")}, []Entry{e("a", "2"), e("b", "3")})
	putTiers(src, "ns/a-1", []Entry{e("a", "1")}, []Entry{e("b", "4")})
	want := [][]string{{"a", "b"}, {"a", "b"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("changes %v, want %v", got, want)
	}
	if len(got) > 0 {
		// The handle of a change reads through the fallback.
		putTiers(src, "ns/a-1", nil, []Entry{e("a", "2")})
	}
}

// TestFallbackSpecs: a fallback must be another index of the same source,
// backing one index and backed by none.
func TestFallbackSpecs(t *testing.T) {
	for name, spec := range map[string]SourceSpec{
		"unknown primary":  {Name: "s", Indexes: []string{"a", "b"}, Fallbacks: map[string]string{"x": "b"}},
		"unknown fallback": {Name: "s", Indexes: []string{"a", "b"}, Fallbacks: map[string]string{"a": "x"}},
		"itself":           {Name: "s", Indexes: []string{"a"}, Fallbacks: map[string]string{"a": "a"}},
		"chained":          {Name: "s", Indexes: []string{"a", "b", "c"}, Fallbacks: map[string]string{"a": "b", "b": "c"}},
		"shared":           {Name: "s", Indexes: []string{"a", "b", "c"}, Fallbacks: map[string]string{"a": "c", "b": "c"}},
	} {
		if _, err := New(spec); err == nil {
			t.Errorf("%s: New accepted %+v", name, spec)
		} else if !strings.Contains(err.Error(), "fallback") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A reload can give an index a fallback, and take it away.
	s, err := New(SourceSpec{Name: "s", Indexes: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	putTiers(s.Source("s"), "o", nil, []Entry{e("k", "v")})
	if got := s.Lookup("a", "k"); got != nil {
		t.Fatalf("a k = %v before the fallback", got)
	}
	if _, err := s.Reconfigure([]SourceSpec{{Name: "s", Indexes: []string{"a", "b"}, Fallbacks: map[string]string{"a": "b"}}}, nil); err != nil {
		t.Fatal(err)
	}
	ix, _ := s.Index("a")
	if got := ix.Lookup("k"); !slices.Equal(got, []string{"v"}) {
		t.Fatalf("a k = %v with the fallback", got)
	}
	if _, err := s.Reconfigure([]SourceSpec{{Name: "s", Indexes: []string{"a", "b"}}}, nil); err != nil {
		t.Fatal(err)
	}
	if got := s.Lookup("a", "k"); got != nil {
		t.Fatalf("a k = %v after the fallback was taken away", got)
	}
}

// TestFallbackNeverEmpty: while a writer moves a key's values between an
// index and its fallback in single commits, readers by handle and by
// snapshot never see the key empty.
func TestFallbackNeverEmpty(t *testing.T) {
	s, src, ix := newTiered(t)
	putTiers(src, "ns/a-1", []Entry{e("a", "1")}, nil)
	var stop atomic.Bool
	var empty atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if len(ix.Lookup("a")) == 0 {
					empty.Add(1)
				}
				if len(s.Snapshot().Lookup(ix, "a")) == 0 {
					empty.Add(1)
				}
			}
		}()
	}
	for i := range 20000 {
		if i%2 == 0 {
			putTiers(src, "ns/a-1", nil, []Entry{e("a", "1")})
		} else {
			putTiers(src, "ns/a-1", []Entry{e("a", "1")}, nil)
		}
	}
	stop.Store(true)
	wg.Wait()
	if n := empty.Load(); n > 0 {
		t.Fatalf("%d lookups saw the key empty", n)
	}
}

// TestLookupPreferring: hints narrow an answer to the values tagged for
// the caller only when every value is tagged and some carry its tag;
// otherwise the answer is whole. Hints of a key are reported as changes
// of the index.
func TestLookupPreferring(t *testing.T) {
	s, err := New(SourceSpec{Name: "slices", Indexes: []string{"eps", "eps/hints"}, Hints: map[string]string{"eps": "eps/hints"}})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("slices")
	var changed []string
	s.OnCommit(func(_, _ *Snapshot, changes []Change) {
		for _, ch := range changes {
			if ch.Index.id != 0 {
				t.Errorf("a change of index %d", ch.Index.id)
			}
			changed = append(changed, ch.Keys...)
		}
	})
	put := func(key string, values []Entry, hints []Entry) {
		tx := src.Begin()
		tx.Put(Object{Key: key, Entries: [][]Entry{values, hints}})
		tx.Commit()
	}
	// Service a: every endpoint hinted; b: one endpoint without hints;
	// c: hinted for zones and one node.
	put("a-1", []Entry{e("a", "1"), e("a", "2"), e("a", "3")},
		[]Entry{e("a", "1\tzone=x"), e("a", "2\tzone=y"), e("a", "3\tzone=x"), e("a", "3\tzone=y")})
	put("b-1", []Entry{e("b", "1"), e("b", "2")}, []Entry{e("b", "1\tzone=x")})
	put("c-1", []Entry{e("c", "1"), e("c", "2")}, []Entry{e("c", "1\tzone=x"), e("c", "2\tzone=x"), e("c", "1\tnode=n1"), e("c", "2\tnode=n2")})
	ix, _ := s.Index("eps")
	snap := s.Snapshot()
	for _, c := range []struct {
		key    string
		prefer []string
		want   []string
	}{
		{"a", nil, []string{"1", "2", "3"}},
		{"a", []string{"zone=x"}, []string{"1", "3"}},
		{"a", []string{"zone=y"}, []string{"2", "3"}},
		{"a", []string{"zone=z"}, []string{"1", "2", "3"}}, // no endpoint for z: all
		{"b", []string{"zone=x"}, []string{"1", "2"}},      // one without hints: all
		{"c", []string{"node=n2", "zone=x"}, []string{"2"}},
		{"c", []string{"node=n3", "zone=x"}, []string{"1", "2"}},
		{"c", []string{"bad", "zone=x"}, []string{"1", "2"}},
		{"d", []string{"zone=x"}, nil},
	} {
		if got := snap.LookupPreferring(ix, c.key, c.prefer...); !slices.Equal(got, c.want) {
			t.Errorf("%s %v = %q, want %q", c.key, c.prefer, got, c.want)
		}
	}
	if got := snap.ResolvePreferring([]Index{ix}, "a", "zone=y"); !slices.Equal(got, []string{"2", "3"}) {
		t.Errorf("ResolvePreferring = %q", got)
	}
	if got := snap.Keys(ix); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("keys %q", got)
	}
	changed = nil
	put("b-1", []Entry{e("b", "1"), e("b", "2")}, []Entry{e("b", "1\tzone=x"), e("b", "2\tzone=y")})
	if !slices.Equal(changed, []string{"b"}) {
		t.Errorf("changes %q, want [b]", changed)
	}
	if got := s.Snapshot().LookupPreferring(ix, "b", "zone=y"); !slices.Equal(got, []string{"2"}) {
		t.Errorf("b zone=y after hints = %q", got)
	}
}

// BenchmarkLookupPreferring: a lookup of a service of 20 endpoints with a
// fallback and hints (each endpoint hinted for one of 3 zones and one of
// 10 nodes), on 1,000 services: a plain lookup; without a locality; with
// a zone whose endpoints are hinted (the answer narrowed); with a node and
// a zone, as a caller at a Locality asks (narrowed to the node's); and
// with a zone that has none (the answer whole).
func BenchmarkLookupPreferring(b *testing.B) {
	s, err := New(SourceSpec{Name: "slices", Indexes: []string{"eps", "eps/fallback", "eps/hints"},
		Fallbacks: map[string]string{"eps": "eps/fallback"}, Hints: map[string]string{"eps": "eps/hints"}})
	if err != nil {
		b.Fatal(err)
	}
	src := s.Source("slices")
	const services = 1000
	keys := make([]string, services)
	for i := range services {
		keys[i] = fmt.Sprintf("svc-%d", i)
		var values, hints []Entry
		for j := range 20 {
			v := fmt.Sprintf("10.%d.%d.%d:8080", i/256, i%256, j)
			values = append(values, e(keys[i], v))
			hints = append(hints, e(keys[i], v+"\tzone=zone-"+strconv.Itoa(j%3)), e(keys[i], v+"\tnode=node-"+strconv.Itoa(j%10)))
		}
		tx := src.Begin()
		tx.Put(Object{Key: keys[i], Entries: [][]Entry{values, nil, hints}})
		tx.Commit()
	}
	ix, _ := s.Index("eps")
	for _, c := range []struct {
		name   string
		prefer []string
	}{{"no-locality", nil}, {"zone-hinted", []string{"zone=zone-1"}}, {"node-hinted", []string{"node=node-3", "zone=zone-1"}}, {"zone-without-endpoints", []string{"zone=zone-9"}}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				sink = s.Snapshot().LookupPreferring(ix, keys[i%services], c.prefer...)
				i++
			}
		})
	}
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			sink = s.Snapshot().Lookup(ix, keys[i%services])
			i++
		}
	})
	b.Run("handle", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			sink = ix.Lookup(keys[i%services])
			i++
		}
	})
}

// TestCompanionsAfterReload: a handle taken before a reload that gives its
// index a fallback and hints reads them; values from the fallback are
// never narrowed (kube-proxy narrows ready endpoints only); a value that
// holds a tab keeps its hints.
func TestCompanionsAfterReload(t *testing.T) {
	s, err := New(SourceSpec{Name: "g", Indexes: []string{"v"}})
	if err != nil {
		t.Fatal(err)
	}
	ix, _ := s.Index("v")
	if _, err := s.Reconfigure([]SourceSpec{{Name: "g", Indexes: []string{"v", "v/fallback", "v/hints"},
		Fallbacks: map[string]string{"v": "v/fallback"}, Hints: map[string]string{"v": "v/hints"}}}, nil); err != nil {
		t.Fatal(err)
	}
	tx := s.Source("g").Begin()
	tx.Put(Object{Key: "o", Entries: [][]Entry{nil, {e("k", "1"), e("k", "2")}, {e("k", "1\tzone=a"), e("k", "2\tzone=b")}}})
	tx.Commit()
	if got := ix.Lookup("k"); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("a handle of before the reload: %q", got)
	}
	if got := s.Snapshot().LookupPreferring(ix, "k", "zone=a"); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("fallback values narrowed: %q", got)
	}
	tx = s.Source("g").Begin()
	tx.Put(Object{Key: "o", Entries: [][]Entry{{e("k", "x"), e("k", "x\ta")}, nil, {e("k", "x\tzone=q"), e("k", "x\ta\tzone=r")}}})
	tx.Commit()
	if got := s.Snapshot().LookupPreferring(ix, "k", "zone=q"); !slices.Equal(got, []string{"x"}) {
		t.Errorf("a value with a tab: %q, want [x]", got)
	}
}
