package indexer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// commitChecker is an OnCommit function that checks that every commit's
// prev is the snapshot one lower than its next, and comes at or after the
// previous call's next (the function hears only the commits that changed
// some key), whatever their sources.
type commitChecker struct {
	t    *testing.T
	last *Snapshot // the hooks run one at a time
	hook func(prev, next *Snapshot, changes []Change)
}

func (c *commitChecker) commit(prev, next *Snapshot, changes []Change) {
	if c.last != nil && (prev.Seq() < c.last.Seq() || prev.Seq() == c.last.Seq() && prev != c.last) {
		c.t.Errorf("commit of snapshot %d: prev is snapshot %d, before the last one heard of, %d", next.Seq(), prev.Seq(), c.last.Seq())
	}
	if next.Seq() != prev.Seq()+1 {
		c.t.Errorf("commit of snapshot %d after snapshot %d", next.Seq(), prev.Seq())
	}
	c.last = next
	if c.hook != nil {
		c.hook(prev, next, changes)
	}
}

// TestRelistDoesNotBlockOtherSources: while a relist of source a is in
// the middle of its work (a build of an empty source, or the diff of one
// that is not), a write to source b commits and is seen, and a's relist
// is not: with one writer lock for the whole store, b's write waited for
// a's relist, which waited for it (the test fails on its timeout).
func TestRelistDoesNotBlockOtherSources(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	for _, tc := range []struct {
		name  string
		first []Object // in a before the relist
	}{
		{"build", nil},
		{"diff", appModelObjects(n, "ns-a/", true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(SourceSpec{Name: "a", Indexes: []string{"a"}}, SourceSpec{Name: "b", Indexes: []string{"b"}})
			if err != nil {
				t.Fatal(err)
			}
			a, b := s.Source("a"), s.Source("b")
			ixA, _ := s.Index("a")
			ixB, _ := s.Index("b")
			if tc.first != nil {
				a.Replace(tc.first)
			}
			var bChanges [][]Change
			check := &commitChecker{t: t, hook: func(_, _ *Snapshot, changes []Change) {
				for _, ch := range changes {
					if ch.Index == ixB {
						bChanges = append(bChanges, changes)
					}
				}
			}}
			s.OnCommit(check.commit)
			relist := appModelObjects(n, "ns-a/", true)
			for i := range relist {
				relist[i].Entries[0][0].Value = "relisted"
			}
			held := 0
			writeHook = func(src *Source) {
				if src != a {
					return
				}
				held++
				done := make(chan struct{})
				go func() {
					defer close(done)
					for i := range 3 {
						tx := b.Begin()
						tx.Put(Object{Key: "ns/b", Entries: [][]Entry{{{Key: "k", Value: fmt.Sprint("written-", i)}}}})
						tx.Commit()
					}
				}()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					t.Fatal("b's writes did not commit during a's relist")
				}
				if got := ixB.Lookup("k"); len(got) != 1 || got[0] != "written-2" {
					t.Errorf("b's write not visible during a's relist: %q", got)
				}
				if got := ixA.Lookup("model-000000-0"); slices.Contains(got, "relisted") {
					t.Errorf("a's relist visible before it is published: %q", got)
				}
			}
			defer func() { writeHook = nil }()
			a.Replace(relist)
			writeHook = nil
			if held != 1 {
				t.Fatalf("the hook ran %d times, want 1", held)
			}
			if got := ixA.Lookup("model-000000-0"); !slices.Equal(got, []string{"relisted"}) {
				t.Errorf("after the relist: %q", got)
			}
			if got := ixB.Lookup("k"); !slices.Equal(got, []string{"written-2"}) {
				t.Errorf("after the relist, b: %q", got)
			}
			if len(bChanges) != 3 {
				t.Fatalf("%d commits changed b, want 3", len(bChanges))
			}
			for _, changes := range bChanges {
				if len(changes) != 1 || !slices.Equal(changes[0].Keys, []string{"k"}) {
					t.Errorf("a commit of b changed %v", changes)
				}
			}
		})
	}
}

// TestWritersStress: writers of several sources (transactions, relists of
// the whole source and of a part, a source emptied and built again),
// Reconfigure and Compact all at once, while readers check that every
// snapshot they load is one state of each source (its indexes answer
// what its objects say), and the OnCommit function that the commits come
// one after the other, each naming every key whose answer it changed.
func TestWritersStress(t *testing.T) {
	ops := 300
	if testing.Short() {
		ops = 60
	}
	s, err := New(stressSpecs(false, false)...)
	if err != nil {
		t.Fatal(err)
	}
	var ixs []Index          // every index of the fixed sources
	unique := map[int]bool{} // their unique ones' ids
	for i := range stressSources {
		for _, suffix := range []string{"-plain", "-uniq"} {
			ix, ok := s.Index(fmt.Sprint("s", i, suffix))
			if !ok {
				t.Fatal("no index")
			}
			ixs = append(ixs, ix)
			unique[ix.id] = suffix == "-uniq"
		}
	}
	indexKeys := make([]string, stressKeys)
	for k := range indexKeys {
		indexKeys[k] = fmt.Sprint("k-", k)
	}
	var commits atomic.Int64
	check := &commitChecker{t: t, hook: func(prev, next *Snapshot, changes []Change) {
		commits.Add(1)
		named := map[Index]map[string]bool{}
		for _, ch := range changes {
			if named[ch.Index] == nil {
				named[ch.Index] = map[string]bool{}
			}
			for _, k := range ch.Keys {
				named[ch.Index][k] = true
			}
		}
		for _, ix := range ixs {
			for _, k := range indexKeys {
				if !slices.Equal(prev.Lookup(ix, k), next.Lookup(ix, k)) && !named[ix][k] {
					t.Errorf("snapshot %d changed %d/%s (%q to %q) and did not say so", next.Seq(), ix.id, k, prev.Lookup(ix, k), next.Lookup(ix, k))
				}
			}
		}
	}}
	s.OnCommit(check.commit)

	stop := make(chan struct{})
	var readers, writers sync.WaitGroup
	var checked atomic.Int64
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				checkSnapshot(t, s.Snapshot(), indexKeys, unique)
				checked.Add(1)
			}
		}()
	}
	for i := range stressSources {
		writers.Add(1)
		go func() {
			defer writers.Done()
			stressWriter(s.Source(fmt.Sprint("s", i)), rand.New(rand.NewPCG(uint64(i), 1)), i, ops, indexKeys)
		}()
	}
	writers.Add(2)
	go func() {
		defer writers.Done()
		r := rand.New(rand.NewPCG(99, 2))
		for range ops / 10 {
			if _, err := s.Reconfigure(stressSpecs(r.IntN(2) == 0, r.IntN(2) == 0), nil); err != nil {
				t.Error(err)
				return
			}
			if x := s.Source("x"); x != nil {
				tx := x.Begin()
				tx.Put(Object{Key: "x", Entries: [][]Entry{{{Key: "k", Value: "v"}}}})
				tx.Commit()
			}
			time.Sleep(time.Millisecond)
		}
	}()
	go func() {
		defer writers.Done()
		for j := range ops / 5 {
			s.compact(j%2 == 0)
			time.Sleep(time.Millisecond)
		}
	}()
	writers.Wait()
	close(stop)
	readers.Wait()
	checkSnapshot(t, s.Snapshot(), indexKeys, unique)
	t.Logf("%d commits heard, %d snapshots checked", commits.Load(), checked.Load())
}

// The sources of TestWritersStress, the keys of each index and the
// objects of each source.
const (
	stressSources = 4
	stressKeys    = 12 // index keys of each index
	stressObjects = 40 // object keys of each source
)

// stressSpecs are the sources of TestWritersStress: the first keeps its
// objects per key if withObjects, and source x is there too if extra.
func stressSpecs(withObjects, extra bool) []SourceSpec {
	var out []SourceSpec
	for i := range stressSources {
		out = append(out, SourceSpec{
			Name:    fmt.Sprint("s", i),
			Indexes: []string{fmt.Sprint("s", i, "-plain"), fmt.Sprint("s", i, "-uniq")},
			Unique:  []string{fmt.Sprint("s", i, "-uniq")},
			Objects: i == 0 && withObjects,
		})
	}
	if extra {
		out = append(out, SourceSpec{Name: "x", Indexes: []string{"x"}})
	}
	return out
}

// stressObject is a random version of object o of source src: entries of
// its plain index, and one claim of its unique index, most often with its
// name as the value.
func stressObject(r *rand.Rand, indexKeys []string, src, o int) Object {
	name := fmt.Sprint("o-", o)
	var plain, uniq []Entry
	for range 1 + r.IntN(3) {
		plain = append(plain, Entry{Key: indexKeys[r.IntN(stressKeys)], Value: fmt.Sprint("v-", r.IntN(4))})
	}
	value := name // names its claimant
	if r.IntN(3) == 0 {
		value = fmt.Sprint("w-", r.IntN(3))
	}
	uniq = append(uniq, Entry{Key: indexKeys[r.IntN(stressKeys)], Value: value})
	return Object{
		Key:     fmt.Sprint("ns", o%2, "/", name),
		Entries: [][]Entry{plain, uniq},
		Meta:    Meta{Version: fmt.Sprint(r.Int()), Created: int64(1764000000 + r.IntN(3))},
		Payload: fmt.Sprint("p-", src, "-", r.IntN(2)),
	}
}

// stressWriter writes ops times to src, source number i: transactions,
// relists of the whole source and of one namespace, and now and then an
// emptied source.
func stressWriter(src *Source, r *rand.Rand, i, ops int, indexKeys []string) {
	for range ops {
		switch op := r.IntN(10); {
		case op < 6:
			tx := src.Begin()
			for range 1 + r.IntN(3) {
				if r.IntN(4) == 0 {
					tx.Delete(fmt.Sprint("ns", r.IntN(2), "/o-", r.IntN(stressObjects)))
				} else {
					o := r.IntN(stressObjects)
					tx.Put(stressObject(r, indexKeys, i, o))
				}
			}
			tx.Commit()
		case op < 8:
			var objs []Object
			for o := range stressObjects {
				if r.IntN(4) > 0 {
					objs = append(objs, stressObject(r, indexKeys, i, o))
				}
			}
			src.Replace(objs)
		case op < 9:
			ns := r.IntN(2)
			var objs []Object
			for o := ns; o < stressObjects; o += 2 {
				if r.IntN(3) > 0 {
					objs = append(objs, stressObject(r, indexKeys, i, o))
				}
			}
			src.ReplaceWithin(fmt.Sprint("ns", ns, "/"), objs)
		default:
			src.Replace(nil) // emptied: the next relist builds
		}
	}
}

// checkSnapshot checks that each live source's indexes in snap answer
// what its objects in snap give them, and its object count is theirs.
func checkSnapshot(t *testing.T, snap *Snapshot, indexKeys []string, unique map[int]bool) {
	s := snap.s
	t.Helper()
	for id, so := range snap.objects {
		if so == nil {
			continue
		}
		if n := snap.sources[id].objects; n != so.set.n {
			t.Errorf("snapshot %d: source %d counts %d objects and holds %d", snap.Seq(), id, n, so.set.n)
		}
		// Each key's values (want), and, per key, the oldest claimant's.
		want := make([]map[string][]string, len(so.indexes))
		oldest := make([]map[string]claim, len(so.indexes))
		for p := range so.indexes {
			want[p], oldest[p] = map[string][]string{}, map[string]claim{}
		}
		for key, enc := range so.set.All() {
			created := createdOf(enc)
			for p, es := range decode(enc, key, len(so.indexes)) {
				for _, e := range es {
					if !slices.Contains(want[p][e.Key], e.Value) {
						want[p][e.Key] = append(want[p][e.Key], e.Value)
					}
					c := claim{object: key, created: created}
					if o, ok := oldest[p][e.Key]; !ok || older(c, o) {
						oldest[p][e.Key] = c
					}
				}
			}
		}
		for p, ixID := range so.indexes {
			is := snap.indexAt(ixID)
			if is.keys != len(want[p]) {
				t.Errorf("snapshot %d: index %d holds %d keys, its objects give %d", snap.Seq(), ixID, is.keys, len(want[p]))
			}
			for _, k := range indexKeys {
				w := want[p][k]
				if unique[ixID] && len(w) > 1 {
					// The oldest claimant's values.
					var vs []string
					for key, enc := range so.set.All() {
						if key != oldest[p][k].object {
							continue
						}
						for _, e := range decode(enc, key, len(so.indexes))[p] {
							if e.Key == k {
								vs = append(vs, e.Value)
							}
						}
					}
					w = vs
				}
				slices.Sort(w)
				if got := is.values.lookup(s.seed, k); !slices.Equal(got, w) {
					t.Errorf("snapshot %d: index %d answers %q for %s, its objects %q", snap.Seq(), ixID, got, k, w)
				}
			}
		}
	}
}

// TestSlowHookDelaysNoOtherPublication: while the OnCommit call of a
// commit of source a is held, a commit of source b is published (readers
// see it); its own call comes after a's, in commit order, and b's Commit
// returns only once it was made.
func TestSlowHookDelaysNoOtherPublication(t *testing.T) {
	s, err := New(SourceSpec{Name: "a", Indexes: []string{"a"}}, SourceSpec{Name: "b", Indexes: []string{"b"}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.Source("a"), s.Source("b")
	ixA, _ := s.Index("a")
	ixB, _ := s.Index("b")
	inHook, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var heard []Index
	check := &commitChecker{t: t, hook: func(_, _ *Snapshot, changes []Change) {
		mu.Lock()
		heard = append(heard, changes[0].Index)
		mu.Unlock()
		if changes[0].Index == ixA {
			close(inHook)
			<-release
		}
	}}
	s.OnCommit(check.commit)
	put := func(src *Source, key, value string) {
		txn := src.Begin()
		txn.Put(Object{Key: key, Entries: [][]Entry{{{Key: key, Value: value}}}})
		txn.Commit()
	}
	aDone, bDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(aDone); put(a, "ka", "va") }()
	<-inHook
	go func() { defer close(bDone); put(b, "kb", "vb") }()
	deadline := time.Now().Add(30 * time.Second)
	for len(s.Snapshot().Lookup(ixB, "kb")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("b's commit not published while a's hook is held")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-bDone:
		t.Fatal("b's Commit returned before its hook was called")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-aDone
	<-bDone
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(heard, []Index{ixA, ixB}) {
		t.Fatalf("hooks heard %v, want a's commit then b's", heard)
	}
	if got := s.Snapshot().Lookup(ixA, "ka"); !slices.Equal(got, []string{"va"}) {
		t.Fatalf("a: %v", got)
	}
}
