package indexer

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"weak"
)

// churnObject is an AppModel-like object of generation gen: three index
// keys of its own (one of which changes with gen) to its name.
func churnObject(i, gen int) Object {
	name := fmt.Sprintf("app-%06d", i)
	return Object{Key: "ns/" + name, Entries: [][]Entry{{
		{Key: fmt.Sprintf("model-%06d-a", i), Value: name},
		{Key: fmt.Sprintf("model-%06d-b", i), Value: name},
		{Key: fmt.Sprintf("model-%06d-g%d", i, gen), Value: name},
	}}}
}

func churnStore(t *testing.T) (*Store, *Source) {
	t.Helper()
	s, err := New(SourceSpec{Name: "apps", Indexes: []string{"model-to-app"}, Objects: true})
	if err != nil {
		t.Fatal(err)
	}
	return s, s.Source("apps")
}

// TestCompactKeepsAnswers: a compacted store answers as before, for
// values and objects, calls the commit hook with no changes (so that a
// hook keeping the latest snapshot lets the old one go), and later writes change neither
// the snapshot before Compact nor the one it published (a write copies a
// compacted page before changing it, as any other).
func TestCompactKeepsAnswers(t *testing.T) {
	s, src := churnStore(t)
	ref, refSrc := churnStore(t)
	var objs []Object
	for i := range 3000 {
		objs = append(objs, churnObject(i, 0))
	}
	src.Replace(objs)
	for i := range 3000 {
		tx := src.Begin()
		tx.Put(churnObject(i, 1))
		if i%7 == 0 {
			tx.Delete(fmt.Sprintf("ns/app-%06d", i))
		}
		tx.Commit()
	}
	var hooked []string
	s.OnCommit(func(prev, next *Snapshot, changes []Change) {
		hooked = append(hooked, fmt.Sprintf("%d→%d, %d changes", prev.Seq(), next.Seq(), len(changes)))
	})
	before := s.Snapshot()
	if !s.Compact() {
		t.Fatal("Compact after writes did nothing")
	}
	after := s.Snapshot()
	if s.Compact() || s.Snapshot() != after {
		t.Fatal("a second Compact, with no write between, published again")
	}
	if after.Writes() != before.Writes() {
		t.Fatalf("Compact counted as a write: %d → %d", before.Writes(), after.Writes())
	}
	// A commit that changes no index is no write: Compact stays idle.
	tx := src.Begin()
	tx.Put(churnObject(1, 1))
	tx.Commit()
	if s.Snapshot().Writes() != after.Writes() || s.Compact() {
		t.Fatalf("an unchanged object counted as a write (Writes %d → %d)", after.Writes(), s.Snapshot().Writes())
	}
	if want := fmt.Sprintf("[%d→%d, 0 changes]", before.Seq(), after.Seq()); fmt.Sprint(hooked) != want {
		t.Fatalf("Compact called the hook %v, want %s", hooked, want)
	}
	if after == before || after.Seq() != before.Seq()+1 {
		t.Fatalf("Compact published seq %d after %d", after.Seq(), before.Seq())
	}
	var want []Object
	for i := range 3000 {
		if i%7 != 0 {
			want = append(want, churnObject(i, 1))
		}
	}
	refSrc.Replace(want)
	checkSame(t, s, ref, "model-to-app")
	ix, _ := s.Index("model-to-app")
	rx, _ := ref.Index("model-to-app")
	for _, k := range ref.Snapshot().Keys(rx) {
		if got, w := fmt.Sprint(after.Objects(ix, k)), fmt.Sprint(ref.Snapshot().Objects(rx, k)); got != w {
			t.Fatalf("objects of %q: %s, want %s", k, got, w)
		}
	}

	// Writes after Compact: every key of the compacted pages changes.
	frozenBefore, frozenAfter := answers(before, ix), answers(after, ix)
	for i := range 3000 {
		tx := src.Begin()
		tx.Put(churnObject(i, 2))
		tx.Commit()
	}
	if s.Snapshot().Writes() != after.Writes()+3000 {
		t.Fatalf("3000 writes after Compact: Writes %d → %d", after.Writes(), s.Snapshot().Writes())
	}
	if got := answers(before, ix); got != frozenBefore {
		t.Fatal("a write after Compact changed the snapshot before it")
	}
	if got := answers(after, ix); got != frozenAfter {
		t.Fatal("a write after Compact changed the snapshot it published")
	}
	want = want[:0]
	for i := range 3000 {
		want = append(want, churnObject(i, 2))
	}
	refSrc.Replace(want)
	checkSame(t, s, ref, "model-to-app")
}

// answers renders every key of ix in snap with its values.
func answers(snap *Snapshot, ix Index) string {
	var b strings.Builder
	for _, k := range snap.Keys(ix) {
		fmt.Fprint(&b, k, snap.Lookup(ix, k), snap.Objects(ix, k))
	}
	return b.String()
}

// TestCompactGivesSpansBack: after churn (every object updated with a new
// index key, a tenth deleted and created again, garbage between writes as
// a decoder makes), the heap's spans in use came to 1.5x those of the same
// state built fresh, though the live heap was the same: the current pages
// lay scattered among spans their old copies filled. After Compact they
// are within 1.15x.
func TestCompactGivesSpansBack(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 40,000 objects three times")
	}
	const n = 40000
	inUse := func() uint64 {
		debug.FreeOSMemory()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	var garbage [][]byte
	build := func(gen int) (*Store, *Source) {
		s, src := churnStore(t)
		objs := make([]Object, n)
		for i := range objs {
			objs[i] = churnObject(i, gen)
		}
		src.Replace(objs)
		return s, src
	}
	base := inUse()
	s, src := build(0)
	for i := range n {
		garbage = append(garbage, make([]byte, 3000))
		if len(garbage) == 64 {
			garbage = garbage[:0]
		}
		tx := src.Begin()
		if i%10 == 0 {
			tx.Delete(fmt.Sprintf("ns/app-%06d", i))
			tx.Commit()
			tx = src.Begin()
		}
		tx.Put(churnObject(i, 1))
		tx.Commit()
	}
	garbage = nil
	churned := inUse() - base
	s.Compact()
	compacted := inUse() - base
	runtime.KeepAlive(s)
	s, src = nil, nil
	base = inUse()
	f, _ := build(1)
	fresh := inUse() - base
	runtime.KeepAlive(f)
	t.Logf("heap in use: fresh %.1f MiB, churned %.1f MiB, compacted %.1f MiB", mib(fresh), mib(churned), mib(compacted))
	if float64(compacted) > 1.15*float64(fresh) {
		t.Fatalf("compacted %.1f MiB in use against %.1f MiB fresh", mib(compacted), mib(fresh))
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// TestCompactAgainAfterWrites: the arrays of a Compact stay while any of
// their pages is current, with the keys and values their replaced pages
// pointed to; after enough writes, the next Compact lets them go: the live
// heap is then that of a store never compacted, with the same writes. Too
// few writes since the last Compact, and it does nothing.
func TestCompactAgainAfterWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 40,000 objects twice")
	}
	const n = 40000
	run := func(compact bool) (uint64, *Store) {
		base := liveHeap()
		s, src := churnStore(t)
		objs := make([]Object, n)
		for i := range objs {
			objs[i] = churnObject(i, 0)
		}
		src.Replace(objs)
		if compact && !s.compact(true) {
			t.Fatal("forced Compact did nothing")
		}
		for i := range 10 {
			tx := src.Begin()
			tx.Put(churnObject(i, 1))
			tx.Commit()
		}
		if compact && s.Compact() {
			t.Fatal("Compact after 10 writes compacted")
		}
		// Every object but those of one page of the first index moves
		// to a new key: that page keeps its array.
		ix, _ := s.Index("model-to-app")
		page0 := func(key string) bool { return ix.head.Load().values.page(s.hash(key)) == 0 }
		for i := range n {
			o := churnObject(i, 2)
			if page0(o.Entries[0][2].Key) || page0(churnObject(i, 0).Entries[0][2].Key) {
				continue
			}
			tx := src.Begin()
			tx.Put(o)
			tx.Commit()
		}
		if compact && !s.Compact() {
			t.Fatalf("Compact after %d writes did nothing", n)
		}
		return liveHeap() - base, s
	}
	plain, s1 := run(false)
	runtime.KeepAlive(s1)
	s1 = nil
	compacted, s2 := run(true)
	runtime.KeepAlive(s2)
	t.Logf("live heap after the same writes: never compacted %.1f MiB, compacted before and after them %.1f MiB", mib(plain), mib(compacted))
	if float64(compacted) > 1.05*float64(plain) {
		t.Fatalf("compacted %.1f MiB live against %.1f MiB never compacted", mib(compacted), mib(plain))
	}
}

// TestCompactChunksApart: each chunk of a compacted table is allocated on
// its own, so a chunk that no write copied keeps only its own pages'
// array: after writes that replace every page of every other chunk, their
// arrays are collected. In one array of chunks, the untouched one kept
// them all, and the live heap was 1.6x that of a store never compacted.
func TestCompactChunksApart(t *testing.T) {
	s, src := churnStore(t)
	const n = 40000
	objs := make([]Object, n)
	for i := range objs {
		objs[i] = churnObject(i, 0)
	}
	src.Replace(objs)
	if !s.compact(true) {
		t.Fatal("forced Compact did nothing")
	}
	ix, _ := s.Index("model-to-app")
	tb := ix.head.Load().values
	if len(tb.dir) < 4 {
		t.Fatalf("%d chunks: too few for the test", len(tb.dir))
	}
	var arrays []weak.Pointer[group]
	for _, c := range tb.dir {
		for _, p := range c {
			if !isEmptyPage(p) {
				arrays = append(arrays, weak.Make(&p[0]))
				break
			}
		}
	}
	inChunk0 := func(o Object) bool {
		for _, e := range o.Entries[0] {
			if tb.page(s.hash(e.Key))>>chunkBits == 0 {
				return true
			}
		}
		return false
	}
	// Every object moves to new keys, except those with a key in chunk 0.
	for i := range n {
		if inChunk0(churnObject(i, 0)) || inChunk0(churnObject(i, 1)) {
			continue
		}
		tx := src.Begin()
		tx.Put(churnObject(i, 1))
		tx.Commit()
	}
	if ix.head.Load().values.bits != tb.bits {
		t.Fatal("the table was rehashed: the test needs its pages where they were")
	}
	tb = table{}
	runtime.GC()
	runtime.GC()
	alive := 0
	for _, a := range arrays[1:] {
		if a.Value() != nil {
			alive++
		}
	}
	runtime.KeepAlive(s)
	if alive > 0 {
		t.Fatalf("%d of %d rewritten chunks' page arrays are still alive", alive, len(arrays)-1)
	}
}
