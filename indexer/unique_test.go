package indexer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// claimModel is the reference that the unique tests hold the store to: each
// object's meta and entries, and the rule written out plainly.
type claimModel struct {
	objects map[string]modelObject
}

type modelObject struct {
	meta    Meta
	entries []Entry // of the one index
}

// answer is what key answers: for a unique index the values of the
// oldest object that gives the key any (creation time, then object key),
// else every object's values.
func (m *claimModel) answer(key string, unique bool) []string {
	type claimant struct {
		key  string
		meta Meta
		vs   []string
	}
	var cs []claimant
	for k, o := range m.objects {
		var vs []string
		for _, e := range o.entries {
			if e.Key == key && !slices.Contains(vs, e.Value) {
				vs = append(vs, e.Value)
			}
		}
		if len(vs) > 0 {
			cs = append(cs, claimant{k, o.meta, vs})
		}
	}
	var out []string
	sort.Slice(cs, func(a, b int) bool {
		if ra, rb := rankOf(cs[a].meta.Created), rankOf(cs[b].meta.Created); ra != rb {
			return ra < rb
		}
		return cs[a].key < cs[b].key
	})
	for i, c := range cs {
		if unique && i > 0 {
			break
		}
		for _, v := range c.vs {
			if !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	sort.Strings(out)
	return out
}

// rankOf orders creation times, an unknown one (0) after every known one.
func rankOf(created int64) int64 {
	if created == 0 {
		return 1 << 62
	}
	return created
}

// conflicts counts the keys whose unique answer differs from the union.
func (m *claimModel) conflicts(keys []string) int {
	n := 0
	for _, k := range keys {
		if len(m.answer(k, true)) != len(m.answer(k, false)) {
			n++
		}
	}
	return n
}

var modelKeys = []string{"m0", "m1", "m2", "m3"}

// modelValues: some name no object, some name objects of the model test
// (in one namespace or two), as a unique index's values often name their
// claimant.
var modelValues = []string{"app0", "app1", "app2", "a", "b", "c"}

// randomObject gives an object a few entries over few keys and values,
// and one of few creation times, so that claims collide often.
func randomObject(r *rand.Rand) modelObject {
	o := modelObject{meta: Meta{Created: int64(r.IntN(3)), Version: fmt.Sprint(r.IntN(1000) + 1)}}
	for range r.IntN(4) {
		o.entries = append(o.entries, e(modelKeys[r.IntN(len(modelKeys))], modelValues[r.IntN(len(modelValues))]))
	}
	return o
}

func entriesOf(o modelObject) [][]Entry { return [][]Entry{slices.Clone(o.entries)} }

// TestUniqueMatchesModel writes random claims and deletes, relists,
// reloads that toggle unique and rebuilds, and after each commit checks
// every key's answer, the conflict count, and that the keys a commit
// reports are exactly those whose answer changed.
func TestUniqueMatchesModel(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			if seed%2 == 1 {
				// Keys back to one value lose their claims at once.
				defer func(was int) { maxSingles = was }(maxSingles)
				maxSingles = 1
			}
			u := newUniqueRun(t, r, seed)
			for step := range 300 {
				before := u.answers()
				what := ""
				switch op := r.IntN(24); {
				case op >= 20:
					u.move()
					what = "move"
				case op < 10:
					u.txn()
					what = "txn"
				case op < 14:
					u.relist()
					what = "replace"
				case op < 16:
					u.unique = !u.unique
					if _, err := u.s.Reconfigure([]SourceSpec{u.spec()}, nil); err != nil {
						t.Fatal(err)
					}
					what = fmt.Sprintf("reconfigure unique=%v", u.unique)
				default:
					u.rebuild(step)
					continue
				}
				u.check(step, what, before)
				if u.unique {
					checkExplain(t, u.s, u.ix, u.m)
				}
			}
		})
	}
}

// uniqueObjectNames are the objects of TestUniqueMatchesModel.
var uniqueObjectNames = []string{"ns/a", "ns/b", "ns/c", "ns/d", "xs/b", "xs/c"}

// uniqueRun is one seed of TestUniqueMatchesModel: a store of one index,
// unique or not, the model it must match, and the keys its commits
// reported since the last answers.
type uniqueRun struct {
	t        *testing.T
	r        *rand.Rand
	seed     uint64
	unique   bool
	s        *Store
	src      *Source
	ix       Index
	m        *claimModel
	reported map[string]bool
}

// newUniqueRun makes the store of a seed, unique, and records the keys
// each commit reports.
func newUniqueRun(t *testing.T, r *rand.Rand, seed uint64) *uniqueRun {
	u := &uniqueRun{t: t, r: r, seed: seed, unique: true}
	s, err := New(u.spec())
	if err != nil {
		t.Fatal(err)
	}
	u.s = s
	s.OnCommit(func(prev, next *Snapshot, changes []Change) {
		for _, c := range changes {
			for _, k := range c.Keys {
				u.reported[k] = true
			}
		}
	})
	u.m = &claimModel{objects: map[string]modelObject{}}
	u.src = s.Source("src")
	u.ix, _ = s.Index("ix")
	return u
}

// spec is the store's source as the run has it now.
func (u *uniqueRun) spec() SourceSpec {
	// Half the seeds keep the object keys per index key, where claims are
	// found; the others find them by name or by reading every object.
	s := SourceSpec{Name: "src", Indexes: []string{"ix"}, Objects: u.seed%4 < 2}
	if u.unique {
		s.Unique = []string{"ix"}
	}
	return s
}

// answers returns every key's answer and forgets the keys reported so far.
func (u *uniqueRun) answers() map[string][]string {
	out := map[string][]string{}
	for _, k := range modelKeys {
		out[k] = slices.Clone(u.ix.Lookup(k))
	}
	u.reported = map[string]bool{}
	return out
}

// check: after step, every key answers as the model does, with the
// objects behind it; the keys whose answer changed since before are those
// reported; the conflicts are counted right.
func (u *uniqueRun) check(step int, what string, before map[string][]string) {
	t, s, ix, m, unique := u.t, u.s, u.ix, u.m, u.unique
	t.Helper()
	for _, k := range modelKeys {
		want := m.answer(k, unique)
		got := ix.Lookup(k)
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("step %d (%s): %s answers %v, want %v (objects %+v) claims %+v chosen %v", step, what, k, got, want, m.objects, u.src.claims, s.Snapshot().indexes[ix.id].chosen)
		}
		// The objects behind the key: its claimants, or, in a conflict,
		// the one answered.
		var claimants []string
		for name, o := range m.objects {
			if slices.ContainsFunc(o.entries, func(en Entry) bool { return en.Key == k }) {
				claimants = append(claimants, name)
			}
		}
		sort.Strings(claimants)
		conflict := unique && len(m.answer(k, true)) != len(m.answer(k, false))
		if conflict {
			claimants = []string{oldestOf(m, claimants)}
		}
		if objs := s.Snapshot().Objects(ix, k); u.spec().Objects && !slices.Equal(objs, claimants) && !(len(objs) == 0 && len(claimants) == 0) {
			t.Fatalf("step %d (%s): objects of %s = %v, want %v", step, what, k, objs, claimants)
		}
		changed := !slices.Equal(before[k], got)
		if before != nil && changed != u.reported[k] {
			t.Fatalf("step %d (%s): %s changed %v → %v, reported %v", step, what, k, before[k], got, u.reported[k])
		}
	}
	want := 0
	if unique {
		want = m.conflicts(modelKeys)
	}
	if got := s.Snapshot().ConflictCount(ix); got != want {
		t.Fatalf("step %d (%s): %d keys in conflict, want %d (%v)", step, what, got, want, s.Snapshot().Conflicts(ix))
	}
}

// move: a claimant moves to another key, with its name as its value, or
// another value.
func (u *uniqueRun) move() {
	r := u.r
	name := uniqueObjectNames[r.IntN(len(uniqueObjectNames))]
	o, ok := u.m.objects[name]
	if !ok {
		o = modelObject{meta: Meta{Created: int64(r.IntN(3)), Version: "1"}}
	}
	v := objectName(name)
	if r.IntN(3) == 0 {
		v = modelValues[r.IntN(len(modelValues))]
	}
	o.entries = []Entry{e(modelKeys[r.IntN(len(modelKeys))], v)}
	u.m.objects[name] = o
	tx := u.src.Begin()
	tx.Put(Object{Key: name, Entries: entriesOf(o), Meta: o.meta})
	tx.Commit()
}

// txn: one transaction of one to three puts and deletes.
func (u *uniqueRun) txn() {
	r := u.r
	tx := u.src.Begin()
	for range 1 + r.IntN(3) {
		name := uniqueObjectNames[r.IntN(len(uniqueObjectNames))]
		if r.IntN(3) == 0 {
			delete(u.m.objects, name)
			tx.Delete(name)
			continue
		}
		o := randomObject(r)
		if old, ok := u.m.objects[name]; ok && r.IntN(4) > 0 {
			o.meta.Created = old.meta.Created // an update
		}
		u.m.objects[name] = o
		tx.Put(Object{Key: name, Entries: entriesOf(o), Meta: o.meta})
	}
	tx.Commit()
}

// relist: a relist, some objects changed, some gone.
func (u *uniqueRun) relist() {
	r := u.r
	var objs []Object
	next := map[string]modelObject{}
	for name, o := range u.m.objects {
		if r.IntN(4) == 0 {
			continue
		}
		if r.IntN(3) == 0 {
			o = randomObject(r)
		}
		next[name] = o
		objs = append(objs, Object{Key: name, Entries: entriesOf(o), Meta: o.meta})
	}
	u.m.objects = next
	u.src.Replace(objs)
}

// rebuild: a fresh store filled in one Replace answers as the store
// written step by step.
func (u *uniqueRun) rebuild(step int) {
	t := u.t
	s2, err := New(u.spec())
	if err != nil {
		t.Fatal(err)
	}
	var objs []Object
	for name, o := range u.m.objects {
		objs = append(objs, Object{Key: name, Entries: entriesOf(o), Meta: o.meta})
	}
	s2.Source("src").Replace(objs)
	ix2, _ := s2.Index("ix")
	for _, k := range modelKeys {
		if got, want := ix2.Lookup(k), u.ix.Lookup(k); !slices.Equal(got, want) {
			t.Fatalf("step %d: rebuilt store answers %s %v, incremental %v", step, k, got, want)
		}
	}
}

// oldestOf returns the oldest of the named objects of m.
func oldestOf(m *claimModel, names []string) string {
	best := names[0]
	for _, n := range names[1:] {
		a, b := rankOf(m.objects[n].meta.Created), rankOf(m.objects[best].meta.Created)
		if a < b || a == b && n < best {
			best = n
		}
	}
	return best
}

// checkExplain holds Explain to the claimModel: each key's claimants, oldest
// first, the first chosen when the key is in conflict.
func checkExplain(t *testing.T, s *Store, ix Index, m *claimModel) {
	t.Helper()
	s.Explain(func(x *Explainer) {
		got := x.Claims(ix, modelKeys)
		for _, k := range modelKeys {
			cl := got[k]
			var names []string
			for _, c := range cl {
				names = append(names, c.Object)
				if o := m.objects[c.Object]; c.Meta != o.meta {
					t.Fatalf("%s: claim of %s has meta %+v, want %+v", k, c.Object, c.Meta, o.meta)
				}
			}
			var want []string
			for name, o := range m.objects {
				for _, e := range o.entries {
					if e.Key == k {
						want = append(want, name)
						break
					}
				}
			}
			sort.Strings(want)
			sorted := slices.Clone(names)
			sort.Strings(sorted)
			if !slices.Equal(sorted, want) {
				t.Fatalf("%s: claimants %v, want %v", k, names, want)
			}
			conflict := len(m.answer(k, true)) != len(m.answer(k, false))
			for j, c := range cl {
				if c.Chosen != (conflict && j == 0) {
					t.Fatalf("%s: claim %d (%s) chosen=%v, conflict=%v", k, j, c.Object, c.Chosen, conflict)
				}
				if j > 0 && older(claim{object: c.Object, created: c.Meta.Created}, claim{object: cl[j-1].Object, created: cl[j-1].Meta.Created}) {
					t.Fatalf("%s: claims not oldest first: %v", k, names)
				}
			}
			if conflict && !slices.Equal(slices.Sorted(slices.Values(cl[0].Values)), m.answer(k, true)) {
				t.Fatalf("%s: chosen claim gives %v, answer %v", k, cl[0].Values, m.answer(k, true))
			}
		}
	})
}

// TestUniqueValidated: a unique index must be one of the source's, and
// has no fallback or hints.
func TestUniqueValidated(t *testing.T) {
	for _, spec := range []SourceSpec{
		{Name: "s", Indexes: []string{"a"}, Unique: []string{"b"}},
		{Name: "s", Indexes: []string{"a", "b"}, Unique: []string{"a"}, Fallbacks: map[string]string{"a": "b"}},
		{Name: "s", Indexes: []string{"a", "b"}, Unique: []string{"b"}, Fallbacks: map[string]string{"a": "b"}},
		{Name: "s", Indexes: []string{"a", "b"}, Unique: []string{"b"}, Hints: map[string]string{"a": "b"}},
	} {
		if _, err := New(spec); err == nil {
			t.Errorf("New(%+v) = nil error", spec)
		}
	}
}

// TestUniqueFlapScansOnce: a claimant that gives a contested key its value
// and takes it back, again and again, reads the source's objects once,
// not at each return; and an object whose creation time is unknown does
// not take a key from one known to be older.
func TestUniqueFlapScansOnce(t *testing.T) {
	s, err := New(SourceSpec{Name: "src", Indexes: []string{"ix"}, Unique: []string{"ix"}})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("src")
	ix, _ := s.Index("ix")
	put := func(name string, created int64, value string) {
		tx := src.Begin()
		tx.Put(Object{Key: name, Meta: Meta{Created: created}, Entries: [][]Entry{{e("hot", value)}}})
		tx.Commit()
	}
	for i := range 1000 {
		tx := src.Begin()
		tx.Put(Object{Key: fmt.Sprintf("ns/filler-%d", i), Meta: Meta{Created: 9}, Entries: [][]Entry{{e(fmt.Sprint("k", i), "f")}}})
		tx.Commit()
	}
	put("ns/holder", 1, "x")
	for i := range 100 {
		v := "y"
		if i%2 == 1 {
			v = "x"
		}
		put("ns/flapper", 5, v)
		if got := ix.Lookup("hot"); !slices.Equal(got, []string{"x"}) {
			t.Fatalf("flap %d: hot = %v, want the holder's [x]", i, got)
		}
	}
	if src.scans != 1 {
		t.Fatalf("%d reads of every object for 100 flaps, want 1", src.scans)
	}
	put("ns/a-unknown", 0, "z") // sorts first by key, but its time is unknown
	if got := ix.Lookup("hot"); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("hot = %v after a claimant of unknown age, want [x]", got)
	}
}

// TestUniqueMovingClaimantReadsNoObjects: a claimant that moves from key to
// key, each held by another object whose value is its name, finds each
// key's holder without reading every object, and never takes a key from
// its older holder; a value that names no claimant still finds them all,
// by reading every object.
func TestUniqueMovingClaimantReadsNoObjects(t *testing.T) {
	s, err := New(SourceSpec{Name: "src", Indexes: []string{"ix"}, Unique: []string{"ix"}})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("src")
	ix, _ := s.Index("ix")
	const n = 1000
	objs := make([]Object, n)
	for i := range objs {
		ns := []string{"team-a/", "team-b/"}[i%2]
		objs[i] = Object{Key: ns + fmt.Sprint("app-", i), Meta: Meta{Created: 5}, Entries: [][]Entry{{e(fmt.Sprint("model-", i), fmt.Sprint("app-", i))}}}
	}
	src.Replace(objs)
	scans := src.scans
	for i := range 3 * n {
		k := fmt.Sprint("model-", i%n)
		tx := src.Begin()
		tx.Put(Object{Key: "team-b/mover", Meta: Meta{Created: 9}, Entries: [][]Entry{{e(k, "mover")}}})
		tx.Commit()
		if got, want := ix.Lookup(k), []string{fmt.Sprint("app-", i%n)}; !slices.Equal(got, want) {
			t.Fatalf("move %d: %s = %v, want its holder's %v", i, k, got, want)
		}
		if c := s.Snapshot().ConflictCount(ix); c != 1 {
			t.Fatalf("move %d: %d keys in conflict, want 1", i, c)
		}
	}
	if got := src.scans - scans; got != 0 {
		t.Fatalf("%d reads of every object for %d moves, want 0", got, 3*n)
	}
	// A holder whose value is not its name: found by reading every object.
	tx := src.Begin()
	tx.Put(Object{Key: "team-a/other", Meta: Meta{Created: 1}, Entries: [][]Entry{{e("shared", "not-a-name")}}})
	tx.Commit()
	tx = src.Begin()
	tx.Put(Object{Key: "team-b/mover", Meta: Meta{Created: 9}, Entries: [][]Entry{{e("shared", "mover")}}})
	tx.Commit()
	if got := ix.Lookup("shared"); !slices.Equal(got, []string{"not-a-name"}) {
		t.Fatalf("shared = %v, want the older holder's [not-a-name]", got)
	}
	if got := src.scans - scans; got != 1 {
		t.Fatalf("%d reads of every object for a holder its value does not name, want 1", got)
	}
}

// TestUniqueTieByPrefix: claimants created at the same second are
// ordered by their key's part before ':' first ("east" before "east2",
// "a" before "a-b"), then by the rest.
func TestUniqueTieByPrefix(t *testing.T) {
	for _, c := range [][2]string{{"east", "east2"}, {"a", "a-b"}, {"a", "a.b"}} {
		if !keyBefore(c[0]+":ns/x", c[1]+":ns/x") || keyBefore(c[1]+":ns/x", c[0]+":ns/x") {
			t.Errorf("%s:ns/x should come before %s:ns/x", c[0], c[1])
		}
	}
	if !keyBefore("ns/a", "ns/b") || keyBefore("ns/b", "ns/a") || keyBefore("east:ns/x", "east:ns/x") {
		t.Error("keys without a prefix, or equal ones, misordered")
	}
}

// TestUniqueClaimsFromObjectKeys: a source that keeps the object keys per
// index key (SourceSpec.Objects) finds a key's claimants there, whatever
// its values are, across any number of namespaces, and however many keys
// a claimant moves through: no read of every object.
func TestUniqueClaimsFromObjectKeys(t *testing.T) {
	s, err := New(SourceSpec{Name: "src", Indexes: []string{"ix"}, Unique: []string{"ix"}, Objects: true})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("src")
	ix, _ := s.Index("ix")
	const n = 3000
	objs := make([]Object, n)
	for i := range objs {
		// 300 namespaces, values that name no object.
		objs[i] = Object{Key: fmt.Sprintf("ns-%d/holder-%d", i%300, i), Meta: Meta{Created: 5}, Entries: [][]Entry{{e(fmt.Sprint("key-", i), fmt.Sprint("value-", i))}}}
	}
	src.Replace(objs)
	scans := src.scans
	for i := range 2 * n {
		k := fmt.Sprint("key-", i%n)
		tx := src.Begin()
		tx.Put(Object{Key: "ns-x/mover", Meta: Meta{Created: 9}, Entries: [][]Entry{{e(k, "mover"), e(k, "mover-2")}}})
		tx.Commit()
		if got, want := ix.Lookup(k), []string{fmt.Sprint("value-", i%n)}; !slices.Equal(got, want) {
			t.Fatalf("move %d: %s = %v, want its holder's %v", i, k, got, want)
		}
		if c := s.Snapshot().ConflictCount(ix); c != 1 {
			t.Fatalf("move %d: %d keys in conflict, want 1", i, c)
		}
	}
	if got := src.scans - scans; got != 0 {
		t.Fatalf("%d reads of every object for %d moves, want 0", got, 2*n)
	}
	// The mover is older than the holder of a key it comes to: it takes it.
	tx := src.Begin()
	tx.Put(Object{Key: "ns-y/elder", Meta: Meta{Created: 1}, Entries: [][]Entry{{e("key-7", "elder")}}})
	tx.Commit()
	if got := ix.Lookup("key-7"); !slices.Equal(got, []string{"elder"}) {
		t.Fatalf("key-7 = %v, want the elder's", got)
	}
	tx = src.Begin()
	tx.Delete("ns-y/elder")
	tx.Commit()
	if got := ix.Lookup("key-7"); !slices.Equal(got, []string{"value-7"}) {
		t.Fatalf("key-7 = %v after the elder left, want the holder's", got)
	}
}
