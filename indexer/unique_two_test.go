package indexer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// twoObj is an object of two indexes.
type twoObj struct {
	meta Meta
	ex   []Entry // of "ix"
	ey   []Entry // of "iy"
}

// modelAnswer is claimModel.answer over one index's entries.
func modelAnswer(objs map[string]twoObj, y bool, key string, unique bool) []string {
	m := &claimModel{objects: map[string]modelObject{}}
	for k, o := range objs {
		es := o.ex
		if y {
			es = o.ey
		}
		m.objects[k] = modelObject{meta: o.meta, entries: es}
	}
	return m.answer(key, unique)
}

type frozen struct {
	snap      *Snapshot
	lookup    map[string][]string
	objects   map[string][]string
	conflicts []string
	count     int
}

// TestUniqueTwoIndexesMatchModel: two indexes sharing key names, each
// unique or not, Objects toggled, the index order swapped by Reconfigure,
// many keys (every choice shard), small maxSingles on some seeds; every
// snapshot taken is checked again at the end (published choices never
// change).
func TestUniqueTwoIndexesMatchModel(t *testing.T) {
	keys := make([]string, 150)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 11))
			if seed%3 == 1 {
				defer func(was int) { maxSingles = was }(maxSingles)
				maxSingles = 2
			}
			w := &twoRun{t: t, r: r, keys: keys, ux: true, uy: seed%2 == 0, objects: seed%4 < 2, objs: map[string]twoObj{}}
			s, err := New(w.spec())
			if err != nil {
				t.Fatal(err)
			}
			w.s = s
			w.src = s.Source("src")
			w.ix, _ = s.Index("ix")
			w.iy, _ = s.Index("iy")
			for step := range 150 {
				what := ""
				switch op := r.IntN(30); {
				case op < 16:
					w.txn()
					what = "txn"
				case op < 20:
					w.relist()
					what = "replace"
				default:
					switch r.IntN(4) {
					case 0:
						w.ux = !w.ux
					case 1:
						w.uy = !w.uy
					case 2:
						w.objects = !w.objects
					case 3:
						w.swapped = !w.swapped
					}
					if _, err := s.Reconfigure([]SourceSpec{w.spec()}, nil); err != nil {
						t.Fatal(err)
					}
					what = fmt.Sprintf("reconfigure ux=%v uy=%v objects=%v swapped=%v", w.ux, w.uy, w.objects, w.swapped)
				}
				w.check(step, what)
				w.freeze()
			}
			w.checkHeld()
		})
	}
}

var (
	// twoValues are the values of the objects of TestUniqueTwoIndexesMatchModel.
	twoValues = []string{"a", "b", "c", "ns/a", "ns/b", "v1", "v2"}
	// twoNames are the names of its objects.
	twoNames = []string{"ns/a", "ns/b", "ns/c", "xs/a", "xs/b", "a", "b", "c"}
)

// twoRun is one seed of TestUniqueTwoIndexesMatchModel: a store of two
// indexes over keys, how it is configured now, the objects it must hold,
// and the snapshots taken so far.
type twoRun struct {
	t                        *testing.T
	r                        *rand.Rand
	keys                     []string
	ux, uy, objects, swapped bool
	s                        *Store
	src                      *Source
	ix, iy                   Index
	objs                     map[string]twoObj
	held                     []frozen
}

// spec is the store's source as the run has it now.
func (w *twoRun) spec() SourceSpec {
	s := SourceSpec{Name: "src", Indexes: []string{"ix", "iy"}, Objects: w.objects}
	if w.swapped {
		s.Indexes = []string{"iy", "ix"}
	}
	if w.ux {
		s.Unique = append(s.Unique, "ix")
	}
	if w.uy {
		s.Unique = append(s.Unique, "iy")
	}
	return s
}

// entries are the entries of o in the store's index order.
func (w *twoRun) entries(o twoObj) [][]Entry {
	if w.swapped {
		return [][]Entry{slices.Clone(o.ey), slices.Clone(o.ex)}
	}
	return [][]Entry{slices.Clone(o.ex), slices.Clone(o.ey)}
}

// randObj makes a random object of both indexes.
func (w *twoRun) randObj() twoObj {
	r, keys, vals := w.r, w.keys, twoValues
	o := twoObj{meta: Meta{Created: int64(r.IntN(3))}}
	// keys in a small window so that claims collide
	base := r.IntN(len(keys) - 5)
	for range r.IntN(4) {
		o.ex = append(o.ex, e(keys[base+r.IntN(5)], vals[r.IntN(len(vals))]))
	}
	for range r.IntN(3) {
		o.ey = append(o.ey, e(keys[base+r.IntN(5)], vals[r.IntN(len(vals))]))
	}
	return o
}

// freeze takes a snapshot and what it answers, to read it again at the
// end.
func (w *twoRun) freeze() {
	ix, iy := w.ix, w.iy
	snap := w.s.Snapshot()
	f := frozen{snap: snap, lookup: map[string][]string{}, objects: map[string][]string{}}
	for _, k := range w.keys {
		f.lookup["x"+k] = slices.Clone(snap.Lookup(ix, k))
		f.lookup["y"+k] = slices.Clone(snap.Lookup(iy, k))
		f.objects["x"+k] = slices.Clone(snap.Objects(ix, k))
		f.objects["y"+k] = slices.Clone(snap.Objects(iy, k))
	}
	f.conflicts = slices.Clone(snap.Conflicts(ix))
	f.count = snap.ConflictCount(ix) + 1000*snap.ConflictCount(iy)
	w.held = append(w.held, f)
}

// owners are the names of the objects with key k in iy's entries (y) or
// ix's, in order.
func (w *twoRun) owners(y bool, k string) []string {
	var out []string
	for name, o := range w.objs {
		es := o.ex
		if y {
			es = o.ey
		}
		if slices.ContainsFunc(es, func(en Entry) bool { return en.Key == k }) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// check: after step, each index answers every key as the model does, with
// the objects behind it when it keeps them, and counts its conflicts
// right.
func (w *twoRun) check(step int, what string) {
	t, objs := w.t, w.objs
	t.Helper()
	snap := w.s.Snapshot()
	for _, y := range []bool{false, true} {
		h, u := w.ix, w.ux
		if y {
			h, u = w.iy, w.uy
		}
		nconf := 0
		for _, k := range w.keys {
			want := modelAnswer(objs, y, k, u)
			got := snap.Lookup(h, k)
			if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("step %d (%s): y=%v %s = %v, want %v", step, what, y, k, got, want)
			}
			conflict := u && len(want) != len(modelAnswer(objs, y, k, false))
			if conflict {
				nconf++
			}
			if w.objects {
				wo := w.owners(y, k)
				if conflict {
					m := &claimModel{objects: map[string]modelObject{}}
					for n, o := range objs {
						m.objects[n] = modelObject{meta: o.meta}
					}
					wo = []string{oldestOf(m, wo)}
				}
				if got := snap.Objects(h, k); !slices.Equal(got, wo) && !(len(got) == 0 && len(wo) == 0) {
					t.Fatalf("step %d (%s): y=%v objects of %s = %v, want %v", step, what, y, k, got, wo)
				}
			}
		}
		if got := snap.ConflictCount(h); got != nconf {
			t.Fatalf("step %d (%s): y=%v %d in conflict, want %d", step, what, y, got, nconf)
		}
		if got := len(snap.Conflicts(h)); got != nconf {
			t.Fatalf("step %d (%s): y=%v Conflicts has %d, want %d", step, what, y, got, nconf)
		}
	}
}

// txn: one transaction of one to four puts and deletes.
func (w *twoRun) txn() {
	r := w.r
	tx := w.src.Begin()
	for range 1 + r.IntN(4) {
		name := twoNames[r.IntN(len(twoNames))]
		if r.IntN(4) == 0 {
			delete(w.objs, name)
			tx.Delete(name)
			continue
		}
		o := w.randObj()
		if old, ok := w.objs[name]; ok && r.IntN(3) > 0 {
			o.meta.Created = old.meta.Created
		}
		w.objs[name] = o
		tx.Put(Object{Key: name, Entries: w.entries(o), Meta: o.meta})
	}
	tx.Commit()
}

// relist: a relist, some objects changed, some gone, some new.
func (w *twoRun) relist() {
	r := w.r
	var list []Object
	next := map[string]twoObj{}
	for name, o := range w.objs {
		if r.IntN(4) == 0 {
			continue
		}
		if r.IntN(3) == 0 {
			o = w.randObj()
		}
		next[name] = o
		list = append(list, Object{Key: name, Entries: w.entries(o), Meta: o.meta})
	}
	// more objects in a relist
	for i := range r.IntN(20) {
		name := fmt.Sprintf("r%d/o%d", i%3, r.IntN(40))
		o := w.randObj()
		if _, dup := next[name]; dup {
			continue
		}
		next[name] = o
		list = append(list, Object{Key: name, Entries: w.entries(o), Meta: o.meta})
	}
	w.objs = next
	w.src.Replace(list)
}

// checkHeld: every snapshot taken answers at the end as it did when it
// was taken.
func (w *twoRun) checkHeld() {
	t, ix, iy := w.t, w.ix, w.iy
	for i, f := range w.held {
		snap := f.snap
		for _, k := range w.keys {
			if got := snap.Lookup(ix, k); !slices.Equal(got, f.lookup["x"+k]) {
				t.Fatalf("held %d: Lookup x %s %v, was %v", i, k, got, f.lookup["x"+k])
			}
			if got := snap.Lookup(iy, k); !slices.Equal(got, f.lookup["y"+k]) {
				t.Fatalf("held %d: Lookup y %s %v, was %v", i, k, got, f.lookup["y"+k])
			}
			if got := snap.Objects(ix, k); !slices.Equal(got, f.objects["x"+k]) {
				t.Fatalf("held %d: Objects x %s %v, was %v", i, k, got, f.objects["x"+k])
			}
			if got := snap.Objects(iy, k); !slices.Equal(got, f.objects["y"+k]) {
				t.Fatalf("held %d: Objects y %s %v, was %v", i, k, got, f.objects["y"+k])
			}
		}
		if got := snap.Conflicts(ix); !slices.Equal(got, f.conflicts) {
			t.Fatalf("held %d: Conflicts %v, was %v", i, got, f.conflicts)
		}
		if got := snap.ConflictCount(ix) + 1000*snap.ConflictCount(iy); got != f.count {
			t.Fatalf("held %d: counts %d, was %d", i, got, f.count)
		}
	}
}

// TestChoicesFrozenOncePublished: a writer moves claimants through many keys
// in conflict while readers hold snapshots and read their conflicts again
// and again: a held snapshot answers the same each time (run with -race).
func TestChoicesFrozenOncePublished(t *testing.T) {
	s, err := New(SourceSpec{Name: "src", Indexes: []string{"ix"}, Unique: []string{"ix"}, Objects: true})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("src")
	ix, _ := s.Index("ix")
	const n = 500
	var objs []Object
	for i := range n {
		objs = append(objs, Object{Key: fmt.Sprintf("ns/h%d", i), Meta: Meta{Created: 5}, Entries: [][]Entry{{e(fmt.Sprint("k", i), fmt.Sprint("h", i))}}})
		objs = append(objs, Object{Key: fmt.Sprintf("ns/y%d", i), Meta: Meta{Created: 9}, Entries: [][]Entry{{e(fmt.Sprint("k", i), fmt.Sprint("y", i))}}})
	}
	src.Replace(objs)
	done := make(chan struct{})
	errs := make(chan string, 4)
	for range 2 {
		go func() {
			for {
				select {
				case <-done:
					errs <- ""
					return
				default:
				}
				snap := s.Snapshot()
				c1 := snap.ConflictCount(ix)
				k1 := snap.Conflicts(ix)
				o1 := snap.Objects(ix, "k7")
				l1 := slices.Clone(snap.Lookup(ix, "k7"))
				for range 3 {
					if c := snap.ConflictCount(ix); c != c1 || len(k1) != c1 {
						errs <- fmt.Sprintf("count %d then %d (keys %d)", c1, c, len(k1))
						return
					}
					if k := snap.Conflicts(ix); !slices.Equal(k, k1) {
						errs <- "conflicts changed"
						return
					}
					if o := snap.Objects(ix, "k7"); !slices.Equal(o, o1) {
						errs <- fmt.Sprintf("objects %v then %v", o1, o)
						return
					}
					if l := snap.Lookup(ix, "k7"); !slices.Equal(l, l1) {
						errs <- fmt.Sprintf("lookup %v then %v", l1, l)
						return
					}
				}
			}
		}()
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		tx := src.Begin()
		for range 1 + r.IntN(5) {
			j := r.IntN(n)
			switch r.IntN(3) {
			case 0: // the holder leaves or comes back
				if r.IntN(2) == 0 {
					tx.Delete(fmt.Sprintf("ns/h%d", j))
				} else {
					tx.Put(Object{Key: fmt.Sprintf("ns/h%d", j), Meta: Meta{Created: 5}, Entries: [][]Entry{{e(fmt.Sprint("k", j), fmt.Sprint("h", j))}}})
				}
			case 1: // a mover
				tx.Put(Object{Key: "ns/mover", Meta: Meta{Created: int64(1 + r.IntN(10))}, Entries: [][]Entry{{e(fmt.Sprint("k", j), "mover")}}})
			default:
				tx.Put(Object{Key: fmt.Sprintf("ns/y%d", j), Meta: Meta{Created: 9}, Entries: [][]Entry{{e(fmt.Sprint("k", j), fmt.Sprint("y", r.IntN(3)))}}})
			}
		}
		tx.Commit()
		if i%500 == 0 {
			s.Compact()
		}
	}
	close(done)
	for range 2 {
		if m := <-errs; m != "" {
			t.Fatal(m)
		}
	}
}
