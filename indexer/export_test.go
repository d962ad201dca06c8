package indexer

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"testing"
)

func TestExportGivesBackWhatWasWritten(t *testing.T) {
	s, err := New(SourceSpec{Name: "src", Indexes: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("src")
	tx := src.Begin()
	tx.Put(Object{Key: "o1", Payload: "p1", Entries: [][]Entry{{{"k2", "o1"}, {"k1", "o1"}, {"k1", "o1"}}, {{"x", "v"}}}})
	tx.Put(Object{Key: "o2", Entries: [][]Entry{nil, {{"x", "w"}}}})
	tx.Put(Object{Key: "o3", Entries: [][]Entry{{{"k", "o3"}}}})
	tx.Commit()
	tx = src.Begin()
	tx.Delete("o3")
	tx.Commit()

	type got struct {
		entries [][]Entry
		payload any
	}
	out := map[string]got{}
	n := src.Image().Objects(func(key string, _ Meta, entries [][]Entry, payload any) {
		out[key] = got{norm(entries), payload} // entries are f's only until it returns
	})
	want := map[string]got{
		"o1": {[][]Entry{{{"k1", "o1"}, {"k2", "o1"}}, {{"x", "v"}}}, "p1"},
		"o2": {[][]Entry{{}, {{"x", "w"}}}, nil},
	}
	if n != 2 || !maps.EqualFunc(out, want, func(a, b got) bool {
		return a.payload == b.payload && reflect.DeepEqual(norm(a.entries), norm(b.entries))
	}) {
		t.Errorf("Export = %d %v, want %v", n, out, want)
	}

	// What Export gives, written into a new store, answers the same.
	s2, _ := New(SourceSpec{Name: "src", Indexes: []string{"a", "b"}})
	var objs []Object
	src.Image().Objects(func(key string, _ Meta, entries [][]Entry, payload any) {
		objs = append(objs, Object{Key: key, Entries: norm(entries), Payload: payload})
	})
	s2.Source("src").Replace(objs)
	for _, q := range [][2]string{{"a", "k1"}, {"a", "k2"}, {"a", "k"}, {"b", "x"}} {
		if a, b := s.Lookup(q[0], q[1]), s2.Lookup(q[0], q[1]); !reflect.DeepEqual(a, b) {
			t.Errorf("%v: %v, restored %v", q, a, b)
		}
	}
	if p, _ := s2.Snapshot().Payload(s2.Source("src"), "o1"); p != "p1" {
		t.Errorf("restored payload %v", p)
	}

	if _, err := s.Reconfigure(nil, nil); err != nil {
		t.Fatal(err)
	}
	if n := src.Image().Objects(func(string, Meta, [][]Entry, any) { t.Error("a removed source exported an object") }); n != 0 {
		t.Errorf("a removed source exported %d objects", n)
	}
}

func norm(ess [][]Entry) [][]Entry {
	out := make([][]Entry, len(ess))
	for i, es := range ess {
		out[i] = append([]Entry{}, es...)
	}
	return out
}

// save is what a snapshot keeps of an Image: a string table and tables of
// numbers, and the objects.
type saved struct {
	strs    []string
	indexes []SavedIndex
	objs    []Object
	count   int
}

func save(img *Image) *saved {
	sv := &saved{}
	ids := map[string]uint32{}
	id := func(s string) uint32 {
		if n, ok := ids[s]; ok {
			return n
		}
		ids[s] = uint32(len(sv.strs))
		sv.strs = append(sv.strs, s)
		return ids[s]
	}
	for i := range img.Indexes() {
		type row struct {
			key    string
			values []uint32
			objs   []uint32
		}
		var rows []row
		img.Table(i, func(key string, values, objects []string) {
			r := row{key: key}
			for _, v := range values {
				r.values = append(r.values, id(v))
			}
			for _, o := range objects {
				r.objs = append(r.objs, id(o))
			}
			rows = append(rows, r)
		})
		sv.indexes = append(sv.indexes, SavedIndex{Keys: len(rows), Each: func(f func(string, []uint32, []uint32)) {
			for _, r := range rows {
				f(r.key, r.values, r.objs)
			}
		}})
	}
	sv.count = img.Objects(func(key string, _ Meta, entries [][]Entry, payload any) {
		sv.objs = append(sv.objs, Object{Key: key, Entries: norm(entries), Payload: payload})
	})
	return sv
}

func (sv *saved) load(src *Source) <-chan struct{} {
	return src.Load(sv.strs, sv.indexes, sv.count, func(f func(string, any)) {
		for _, o := range sv.objs {
			if o.Payload != nil {
				f(o.Key, o.Payload)
			}
		}
	}, func() []Object {
		out := make([]Object, len(sv.objs))
		for i, o := range sv.objs {
			out[i] = Object{Key: o.Key, Entries: norm(o.Entries), Payload: o.Payload}
		}
		return out
	})
}

// sameAnswers compares every key of every index of two stores, values and
// object keys, and the payloads and object counts of source "src".
func sameAnswers(t *testing.T, what string, a, b *Store, indexes []string) {
	t.Helper()
	sa, sb := a.Snapshot(), b.Snapshot()
	for _, name := range indexes {
		ia, _ := sa.Index(name)
		ib, _ := sb.Index(name)
		ka, kb := sa.Keys(ia), sb.Keys(ib)
		if !reflect.DeepEqual(ka, kb) {
			t.Fatalf("%s: index %s keys %v, loaded %v", what, name, ka, kb)
		}
		for _, k := range ka {
			if va, vb := sa.Lookup(ia, k), sb.Lookup(ib, k); !reflect.DeepEqual(va, vb) {
				t.Fatalf("%s: %s[%s] = %v, loaded %v", what, name, k, va, vb)
			}
			if oa, ob := sa.Objects(ia, k), sb.Objects(ib, k); !reflect.DeepEqual(oa, ob) {
				t.Fatalf("%s: objects of %s[%s] = %v, loaded %v", what, name, k, oa, ob)
			}
		}
	}
	if na, nb := sa.ObjectCount(a.Source("src")), sb.ObjectCount(b.Source("src")); na != nb {
		t.Fatalf("%s: %d objects, loaded %d", what, na, nb)
	}
	pa, pb := map[string]any{}, map[string]any{}
	sa.Payloads(a.Source("src"), func(k string, p any) { pa[k] = p })
	sb.Payloads(b.Source("src"), func(k string, p any) { pb[k] = p })
	if !reflect.DeepEqual(pa, pb) {
		t.Fatalf("%s: payloads %v, loaded %v", what, pa, pb)
	}
}

// TestLoadAgreesWithTheStore: a store loaded from another's Image answers
// as it does at once, again once its write state is rebuilt, and after
// the same random writes.
func TestLoadAgreesWithTheStore(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	indexes := []string{"a", "b"}
	for _, withObjects := range []bool{false, true} {
		spec := SourceSpec{Name: "src", Indexes: indexes, Objects: withObjects}
		a, _ := New(spec)
		b, _ := New(spec)
		write := func(s *Store, seed uint64, n int) {
			r := rand.New(rand.NewPCG(seed, 1))
			for range n {
				key := fmt.Sprintf("o%d", r.IntN(60))
				tx := s.Source("src").Begin()
				if r.IntN(5) == 0 {
					tx.Delete(key)
				} else {
					var es [][]Entry
					for range 2 {
						var ix []Entry
						for range r.IntN(4) {
							v := key
							if r.IntN(2) == 0 {
								v = fmt.Sprintf("v%d", r.IntN(5))
							}
							ix = append(ix, Entry{Key: fmt.Sprintf("k%d", r.IntN(20)), Value: v})
						}
						es = append(es, ix)
					}
					var p any
					if r.IntN(2) == 0 {
						p = fmt.Sprintf("p%d", r.IntN(3))
					}
					tx.Put(Object{Key: key, Entries: es, Payload: p})
				}
				tx.Commit()
			}
		}
		write(a, rng.Uint64(), 300)
		done := save(a.Source("src").Image()).load(b.Source("src"))
		sameAnswers(t, "at once", a, b, indexes)
		<-done
		sameAnswers(t, "rebuilt", a, b, indexes)
		seed := rng.Uint64()
		write(a, seed, 300)
		write(b, seed, 300)
		sameAnswers(t, "after writes", a, b, indexes)
	}
}

// TestLoadTrustsTheObjects: tables that disagree with the objects (a
// crafted file) answer until the rebuild, which the objects decide.
func TestLoadTrustsTheObjects(t *testing.T) {
	a, _ := New(SourceSpec{Name: "src", Indexes: []string{"a"}})
	tx := a.Source("src").Begin()
	tx.Put(Object{Key: "o1", Entries: [][]Entry{{{"k", "o1"}}}})
	tx.Commit()
	sv := save(a.Source("src").Image())
	sv.strs = append(sv.strs, "ghost")
	sv.indexes[0] = SavedIndex{Keys: 1, Each: func(f func(string, []uint32, []uint32)) {
		f("ghost-key", []uint32{uint32(len(sv.strs) - 1)}, nil)
	}}
	b, _ := New(SourceSpec{Name: "src", Indexes: []string{"a"}})
	done := sv.load(b.Source("src"))
	<-done
	sameAnswers(t, "rebuilt", a, b, []string{"a"})
}
