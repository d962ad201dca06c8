package indexer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
)

func newStore(t testing.TB) (*Store, *Source, Index) {
	t.Helper()
	s, err := New(SourceSpec{Name: "apps", Indexes: []string{"model-to-app"}, Objects: true})
	if err != nil {
		t.Fatal(err)
	}
	ix, _ := s.Index("model-to-app")
	return s, s.Source("apps"), ix
}

func put(src *Source, key string, es ...Entry) {
	tx := src.Begin()
	tx.Put(Object{Key: key, Entries: [][]Entry{es}})
	tx.Commit()
}

func del(src *Source, key string) {
	tx := src.Begin()
	tx.Delete(key)
	tx.Commit()
}

func e(k, v string) Entry { return Entry{Key: k, Value: v} }

func TestKeysGrowShrinkMove(t *testing.T) {
	s, src, ix := newStore(t)
	check := func(step string, want map[string][]string) {
		t.Helper()
		snap := s.Snapshot()
		got := map[string][]string{}
		for _, k := range snap.Keys(ix) {
			got[k] = snap.Lookup(ix, k)
		}
		if len(want) == 0 {
			want = map[string][]string{}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: index = %v, want %v", step, got, want)
		}
		if snap.KeyCount(ix) != len(want) {
			t.Fatalf("%s: KeyCount = %d, want %d", step, snap.KeyCount(ix), len(want))
		}
	}

	put(src, "ns/base", e("model1", "base"), e("model2", "base"))
	check("add", map[string][]string{"model1": {"base"}, "model2": {"base"}})

	put(src, "ns/base", e("model1", "base"), e("model2", "base"), e("model3", "base"))
	check("grow", map[string][]string{"model1": {"base"}, "model2": {"base"}, "model3": {"base"}})

	put(src, "ns/base", e("model3", "base"))
	check("shrink", map[string][]string{"model3": {"base"}})

	put(src, "ns/base", e("model4", "base"))
	check("move", map[string][]string{"model4": {"base"}})

	put(src, "ns/other", e("model4", "other"), e("model4", "other"))
	check("second object", map[string][]string{"model4": {"base", "other"}})
	if got := s.Snapshot().Objects(ix, "model4"); !slices.Equal(got, []string{"ns/base", "ns/other"}) {
		t.Fatalf("Objects = %v", got)
	}

	del(src, "ns/base")
	check("delete", map[string][]string{"model4": {"other"}})
	del(src, "ns/missing")
	del(src, "ns/other")
	check("delete all", nil)
}

func TestSharedValueNeedsEveryContributorGone(t *testing.T) {
	s, src, ix := newStore(t)
	// Two objects contribute the same (key, value): e.g. value = spec.type.
	put(src, "a", e("model1", "model"))
	put(src, "b", e("model1", "model"))
	del(src, "a")
	if got := s.Snapshot().Lookup(ix, "model1"); !slices.Equal(got, []string{"model"}) {
		t.Fatalf("after one of two contributors left: %v", got)
	}
	if got := s.Snapshot().Objects(ix, "model1"); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("objects: %v", got)
	}
	del(src, "b")
	if got := s.Snapshot().Lookup(ix, "model1"); got != nil {
		t.Fatalf("after both left: %v", got)
	}
}

func TestReplaceRemovesWhatVanished(t *testing.T) {
	s, src, ix := newStore(t)
	put(src, "a", e("m1", "a"))
	put(src, "b", e("m2", "b"))
	src.Replace([]Object{
		{Key: "b", Entries: [][]Entry{{e("m3", "b")}}},
		{Key: "c", Payload: "pc", Entries: [][]Entry{{e("m3", "c")}}},
	})
	snap := s.Snapshot()
	if got := snap.Keys(ix); !slices.Equal(got, []string{"m3"}) {
		t.Fatalf("keys after replace = %v", got)
	}
	if got := snap.Lookup(ix, "m3"); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("m3 = %v", got)
	}
	if n := snap.ObjectCount(src); n != 2 {
		t.Fatalf("objects = %d", n)
	}
	if p, ok := snap.Payload(src, "c"); !ok || p != "pc" {
		t.Fatalf("payload = %v %v", p, ok)
	}
	// Incremental writes keep working on top of a replace.
	del(src, "c")
	if got := s.Snapshot().Lookup(ix, "m3"); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("m3 after delete = %v", got)
	}
	src.Replace(nil)
	if n := s.Snapshot().KeyCount(ix); n != 0 {
		t.Fatalf("keys after empty replace = %d", n)
	}
}

func TestResolveChain(t *testing.T) {
	s, err := New(
		SourceSpec{Name: "apps", Indexes: []string{"model-to-app"}},
		SourceSpec{Name: "slices", Indexes: []string{"service-to-addresses"}},
	)
	if err != nil {
		t.Fatal(err)
	}
	apps, slicesSrc := s.Source("apps"), s.Source("slices")
	put(apps, "base", e("model1", "base"), e("model2", "base"))
	put(apps, "iiot", e("model1", "iiot"))
	put(slicesSrc, "base-1", e("base", "10.0.0.2"), e("base", "10.0.0.1"))
	put(slicesSrc, "base-2", e("base", "10.0.0.1"), e("base", "10.0.0.3"))
	put(slicesSrc, "iiot-1", e("iiot", "10.0.1.1"))
	a, _ := s.Index("model-to-app")
	b, _ := s.Index("service-to-addresses")
	got := s.Snapshot().Resolve([]Index{a, b}, "model1")
	want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.1"}
	if !slices.Equal(got, want) {
		t.Fatalf("Resolve = %v, want %v", got, want)
	}
	if got := s.Snapshot().Resolve([]Index{a, b}, "nope"); got != nil {
		t.Fatalf("Resolve of a missing key = %v", got)
	}
}

func TestObjectsOnlyWhenAskedFor(t *testing.T) {
	s, err := New(SourceSpec{Name: "apps", Indexes: []string{"i"}})
	if err != nil {
		t.Fatal(err)
	}
	put(s.Source("apps"), "ns/a", e("k", "a"))
	ix, _ := s.Index("i")
	if got := s.Snapshot().Objects(ix, "k"); got != nil {
		t.Fatalf("Objects = %v without SourceSpec.Objects", got)
	}
	if got := ix.Lookup("k"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Lookup = %v", got)
	}
}

func TestEncodeDecode(t *testing.T) {
	long := string(make([]byte, 300))
	in := [][]Entry{{e("k1", "ns/o"), e("k2", "v2"), e("", "")}, nil, {e(long, long), e("k\x00", "ns/o")}}
	for _, m := range []Meta{{}, {Version: "4127", Created: 1764000000}, {Version: "0x1f", Created: 1}, {Version: "007"}, {Version: "99999999999999999999999"}} {
		enc := encode("ns/o", m, in)
		got := decode(enc, "ns/o", 3)
		if len(got[1]) != 0 {
			t.Fatalf("empty index decoded as %v", got[1])
		}
		got[1] = nil
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("decode(encode) = %q, want %q", got, in)
		}
		if back := decodeMeta(enc); back != m {
			t.Fatalf("decodeMeta = %+v, want %+v", back, m)
		}
	}
}

func TestNewRejectsDuplicates(t *testing.T) {
	if _, err := New(SourceSpec{Name: "a", Indexes: []string{"x"}}, SourceSpec{Name: "b", Indexes: []string{"x"}}); err == nil {
		t.Fatal("duplicate index name accepted")
	}
	if _, err := New(SourceSpec{Name: "a"}, SourceSpec{Name: "a"}); err == nil {
		t.Fatal("duplicate source name accepted")
	}
}

// model is the obvious implementation that the Store must agree with.
type model map[string][]Entry

func (m model) index() map[string][]string {
	out := map[string][]string{}
	for _, es := range m {
		for _, e := range es {
			if !slices.Contains(out[e.Key], e.Value) {
				out[e.Key] = append(out[e.Key], e.Value)
			}
		}
	}
	for k := range out {
		slices.Sort(out[k])
	}
	return out
}

func (m model) objects() map[string][]string {
	out := map[string][]string{}
	for obj, es := range m {
		for _, e := range es {
			if !slices.Contains(out[e.Key], obj) {
				out[e.Key] = append(out[e.Key], obj)
			}
		}
	}
	for k := range out {
		slices.Sort(out[k])
	}
	return out
}

func dump(s *Store, ix Index) map[string][]string {
	snap := s.Snapshot()
	out := map[string][]string{}
	for _, k := range snap.Keys(ix) {
		out[k] = snap.Lookup(ix, k)
	}
	return out
}

// TestIncrementalEqualsRebuild applies random puts, deletes and replaces,
// batched in random transactions, and compares the index after each step
// with the model and with a rebuild from scratch.
func TestIncrementalEqualsRebuild(t *testing.T) {
	t.Run("few keys", func(t *testing.T) { incrementalEqualsRebuild(t, 5, 6, 3, 3000, 1) })
	// Enough keys for pages of many groups, pages that fill up and are
	// laid out anew, and tables that grow.
	t.Run("many keys", func(t *testing.T) { incrementalEqualsRebuild(t, 5000, 2000, 40, 600, 25) })
}

func incrementalEqualsRebuild(t *testing.T, nKeys, nObjs, nVals, steps, every int) {
	rng := rand.New(rand.NewPCG(1, 2))
	randomEntries := func() []Entry {
		var es []Entry
		for range rng.IntN(5) {
			es = append(es, e(fmt.Sprintf("k%d", rng.IntN(nKeys)), fmt.Sprintf("v%d", rng.IntN(nVals))))
		}
		return es
	}
	s, src, ix := newStore(t)
	m := model{}
	for step := range steps {
		switch op := rng.IntN(20); {
		case op == 0:
			var objs []Object
			m = model{}
			for j := range rng.IntN(nObjs) {
				key := fmt.Sprintf("o%d", j)
				es := randomEntries()
				m[key] = slices.Clone(es)
				objs = append(objs, Object{Key: key, Entries: [][]Entry{es}})
			}
			src.Replace(objs)
		default:
			tx := src.Begin()
			for range 1 + rng.IntN(3*nObjs/6+1) {
				key := fmt.Sprintf("o%d", rng.IntN(nObjs))
				if rng.IntN(3) == 0 {
					tx.Delete(key)
					delete(m, key)
					continue
				}
				es := randomEntries()
				m[key] = slices.Clone(es)
				tx.Put(Object{Key: key, Entries: [][]Entry{es}})
			}
			tx.Commit()
		}
		if step%every != 0 && step != steps-1 {
			continue
		}
		want := m.index()
		if got := dump(s, ix); !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: index differs from the model (%d keys, want %d)", step, len(got), len(want))
		}
		wantObjs := m.objects()
		for k := range want {
			if got := s.Snapshot().Objects(ix, k); !slices.Equal(got, wantObjs[k]) {
				t.Fatalf("step %d: objects of %s = %v, want %v", step, k, got, wantObjs[k])
			}
		}
		for i := range nKeys {
			k := fmt.Sprintf("k%d", i)
			if got := s.Lookup("model-to-app", k); !slices.Equal(got, want[k]) {
				t.Fatalf("step %d: lookup %s = %v, want %v", step, k, got, want[k])
			}
		}
		if n := s.Snapshot().ObjectCount(src); n != len(m) {
			t.Fatalf("step %d: objects = %d, want %d", step, n, len(m))
		}
	}
}

// TestReadersNeverSeeHalfAnUpdate moves an object's three keys together
// while readers check that a snapshot holds all three or none.
func TestReadersNeverSeeHalfAnUpdate(t *testing.T) {
	s, src, ix := newStore(t)
	sets := [][]Entry{
		{e("a1", "x"), e("a2", "x"), e("a3", "x")},
		{e("b1", "x"), e("b2", "x"), e("b3", "x")},
	}
	put(src, "x", sets[0]...)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				snap := s.Snapshot()
				for _, set := range sets {
					n := 0
					for _, en := range set {
						n += len(snap.Lookup(ix, en.Key))
					}
					if n != 0 && n != len(set) {
						errs <- fmt.Errorf("a reader saw %d of %d keys of one update", n, len(set))
						return
					}
				}
				_ = ix.Lookup("a1")
			}
		})
	}
	for i := range 2000 {
		put(src, "x", slices.Clone(sets[i%2])...)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestLookupAllocatesNothing(t *testing.T) {
	s, src, ix := newStore(t)
	put(src, "ns/base", e("model1", "base"))
	if n := testing.AllocsPerRun(100, func() { _ = ix.Lookup("model1") }); n != 0 {
		t.Fatalf("Index.Lookup allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = s.Lookup("model-to-app", "model1") }); n != 0 {
		t.Fatalf("Store.Lookup allocates %v times", n)
	}
}

// TestGrowsPages puts keys one by one, far past one page's worth: the
// index spreads over more pages as it grows, and every key stays found.
func TestGrowsPages(t *testing.T) {
	s, src, ix := newStore(t)
	const n = 10_000
	for i := range n {
		put(src, fmt.Sprintf("o%d", i), e(fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)))
	}
	snap := s.Snapshot()
	if bits := snap.indexes[ix.id].values.bits; bits < 3 {
		t.Fatalf("bits = %d after %d keys", bits, n)
	}
	for i := range n {
		k := fmt.Sprintf("k%d", i)
		if got := snap.Lookup(ix, k); !slices.Equal(got, []string{fmt.Sprintf("v%d", i)}) {
			t.Fatalf("%s = %v", k, got)
		}
		if got := snap.Objects(ix, k); !slices.Equal(got, []string{fmt.Sprintf("o%d", i)}) {
			t.Fatalf("objects of %s = %v", k, got)
		}
	}
	if snap.KeyCount(ix) != n || len(snap.Keys(ix)) != n {
		t.Fatalf("KeyCount = %d", snap.KeyCount(ix))
	}
}

// TestLookupResultsHaveNoSpareCapacity: two callers that append to their
// results must not write into one shared array.
func TestLookupResultsHaveNoSpareCapacity(t *testing.T) {
	s, src, ix := newStore(t)
	src.Replace([]Object{
		{Key: "ns/a", Entries: [][]Entry{{e("m", "a"), e("m2", "x")}}},
		{Key: "ns/b", Entries: [][]Entry{{e("m", "b"), e("m2", "x")}}},
		{Key: "ns/c", Entries: [][]Entry{{e("m", "c"), e("m", "d"), e("m", "e")}}},
	})
	put(src, "ns/c", e("m", "c"))                // a removal: the merge had room to spare
	put(src, "ns/d", e("m3", "p"), e("m3", "q")) // added by a transaction
	put(src, "ns/e", e("m3", "r"))               // and grown by another
	chain := []Index{ix, ix}
	put(src, "ns/f", e("a", "m"), e("b", "m2"), e("c", "m3"))
	for _, key := range []string{"m", "m2", "m3", "a"} {
		for name, got := range map[string][]string{
			"Store.Lookup":    s.Lookup("model-to-app", key),
			"Index.Lookup":    ix.Lookup(key),
			"Snapshot.Lookup": s.Snapshot().Lookup(ix, key),
			"Objects":         s.Snapshot().Objects(ix, key),
			"Resolve":         s.Snapshot().Resolve(chain, key),
		} {
			if cap(got) != len(got) {
				t.Errorf("%s(%q) = %v has capacity %d: appends of two callers would share it", name, key, got, cap(got))
			}
		}
	}
}

// TestKeysSortedOncePerState: the sorted keys of an index are computed
// once per published state and shared, so that a page of them costs its
// size; a write gives the next state its own.
func TestKeysSortedOncePerState(t *testing.T) {
	s, src, ix := newStore(t)
	put(src, "ns/a", e("m2", "a"), e("m1", "a"))
	k1, k2 := s.Snapshot().Keys(ix), s.Snapshot().Keys(ix)
	if &k1[0] != &k2[0] {
		t.Error("two calls on one state sorted the keys twice")
	}
	put(src, "ns/b", e("m0", "b"))
	if k3 := s.Snapshot().Keys(ix); !slices.Equal(k3, []string{"m0", "m1", "m2"}) || !slices.Equal(k1, []string{"m1", "m2"}) {
		t.Errorf("after a write: %v (the earlier state's %v)", k3, k1)
	}
}

// TestReplaceWithin: a replace of one part of a source's objects (one
// prefix of their keys) leaves the other parts alone, and values that
// two parts give stay until both withdraw them.
func TestReplaceWithin(t *testing.T) {
	s, err := New(SourceSpec{Name: "r", Indexes: []string{"ix"}})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("r")
	obj := func(key, k, v string) Object {
		return Object{Key: key, Entries: [][]Entry{{{Key: k, Value: v}}}}
	}
	src.ReplaceWithin("a:", []Object{obj("a:1", "k", "x"), obj("a:2", "k", "shared")})
	src.ReplaceWithin("b:", []Object{obj("b:1", "k", "y"), obj("b:2", "k", "shared")})
	if got := s.Lookup("ix", "k"); !slices.Equal(got, []string{"shared", "x", "y"}) {
		t.Fatalf("after both parts: %q", got)
	}
	src.ReplaceWithin("a:", []Object{obj("a:1", "k", "x2")})
	if got := s.Lookup("ix", "k"); !slices.Equal(got, []string{"shared", "x2", "y"}) {
		t.Fatalf("after a's relist: %q", got)
	}
	src.ReplaceWithin("b:", nil)
	if got := s.Lookup("ix", "k"); !slices.Equal(got, []string{"x2"}) {
		t.Fatalf("after b's empty relist: %q", got)
	}
	if n := s.Snapshot().ObjectCount(src); n != 1 {
		t.Fatalf("%d objects, want 1", n)
	}
}
