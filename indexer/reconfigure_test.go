package indexer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// dumpAll reads every index of snap by name: index -> key -> values, and
// index -> key -> object keys where kept.
func dumpAll(snap *Snapshot, names ...string) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for _, n := range names {
		ix, ok := snap.Index(n)
		if !ok {
			continue
		}
		m := map[string][]string{}
		for _, k := range snap.Keys(ix) {
			m[k] = snap.Lookup(ix, k)
			if os := snap.Objects(ix, k); os != nil {
				m["objects of "+k] = os
			}
		}
		out[n] = m
	}
	return out
}

func TestReconfigureKeepsWhatStays(t *testing.T) {
	s, err := New(
		SourceSpec{Name: "apps", Indexes: []string{"a", "b"}},
		SourceSpec{Name: "svc", Indexes: []string{"c"}},
	)
	if err != nil {
		t.Fatal(err)
	}
	apps, svc := s.Source("apps"), s.Source("svc")
	tx := apps.Begin()
	tx.Put(Object{Key: "o1", Entries: [][]Entry{{e("a1", "x")}, {e("b1", "y")}}})
	tx.Put(Object{Key: "o2", Entries: [][]Entry{{e("a1", "z")}, {e("b2", "y")}}})
	tx.Commit()
	put(svc, "s1", e("c1", "ip"))
	ixA, _ := s.Index("a")
	ixC, _ := s.Index("c")

	// apps loses b, gains d and object keys; svc goes; web comes.
	retired, err := s.Reconfigure([]SourceSpec{
		{Name: "web", Indexes: []string{"c"}},
		{Name: "apps", Indexes: []string{"d", "a"}, Objects: true},
	}, func(srcs map[string]*Source, _ *Snapshot) any { return len(srcs) })
	if err != nil {
		t.Fatal(err)
	}
	snap := s.Snapshot()
	if snap.Meta() != 2 {
		t.Fatalf("meta = %v", snap.Meta())
	}
	var names []int
	for _, r := range retired {
		names = append(names, r.id)
	}
	if len(retired) != 2 {
		t.Fatalf("retired %v, want b and the old c", names)
	}
	if got := ixA.Lookup("a1"); !reflect.DeepEqual(got, []string{"x", "z"}) {
		t.Fatalf("kept index through its old handle: %v", got)
	}
	if got := ixC.Lookup("c1"); got != nil {
		t.Fatalf("a retired handle still reads %v", got)
	}
	if s.Source("svc") != nil {
		t.Fatal("removed source still named")
	}
	put(svc, "s2", e("c1", "ghost")) // a late write of a removed source
	want := map[string]map[string][]string{
		"a": {"a1": {"x", "z"}, "objects of a1": {"o1", "o2"}},
		"c": {},
		"d": {},
	}
	if got := dumpAll(s.Snapshot(), "a", "b", "c", "d"); !reflect.DeepEqual(got, want) {
		t.Fatalf("after reconfigure:\n got %v\nwant %v", got, want)
	}

	// The kept source's writes withdraw exactly what its objects had.
	tx = apps.Begin()
	tx.Put(Object{Key: "o1", Entries: [][]Entry{{e("d1", "o1")}, {e("a2", "x")}}})
	tx.Delete("o2")
	tx.Commit()
	want = map[string]map[string][]string{
		"a": {"a2": {"x"}, "objects of a2": {"o1"}},
		"c": {},
		"d": {"d1": {"o1"}, "objects of d1": {"o1"}},
	}
	if got := dumpAll(s.Snapshot(), "a", "b", "c", "d"); !reflect.DeepEqual(got, want) {
		t.Fatalf("after writes:\n got %v\nwant %v", got, want)
	}

	if _, err := s.Reconfigure([]SourceSpec{{Name: "x", Indexes: []string{"a"}}, {Name: "y", Indexes: []string{"a"}}}, nil); err == nil {
		t.Fatal("an index declared twice was accepted")
	}
	if got := dumpAll(s.Snapshot(), "a"); !reflect.DeepEqual(got["a"], want["a"]) {
		t.Fatalf("a refused reconfigure changed the store: %v", got)
	}
}

// TestReconfigureAgreesWithFresh is a model check: whatever sequence of
// reconfigures and writes, the store holds what a store built fresh with
// the last specs and fed the same objects holds.
func TestReconfigureAgreesWithFresh(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	allIndexes := []string{"i0", "i1", "i2", "i3", "i4"}
	randomSpecs := func() []SourceSpec {
		var specs []SourceSpec
		perm := rng.Perm(len(allIndexes))
		for _, src := range []string{"s0", "s1", "s2"} {
			if rng.IntN(4) == 0 {
				continue
			}
			spec := SourceSpec{Name: src, Objects: rng.IntN(2) == 0}
			for len(perm) > 0 && rng.IntN(3) > 0 {
				spec.Indexes = append(spec.Indexes, allIndexes[perm[0]])
				perm = perm[1:]
			}
			specs = append(specs, spec)
		}
		return specs
	}
	// objects: source -> object key -> index name -> entries, the truth.
	objects := map[string]map[string]map[string][]Entry{}
	write := func(s *Store, specs []SourceSpec) {
		for _, spec := range specs {
			src := s.Source(spec.Name)
			if objects[spec.Name] == nil {
				objects[spec.Name] = map[string]map[string][]Entry{}
			}
			tx := src.Begin()
			for range 1 + rng.IntN(6) {
				key := fmt.Sprintf("o%d", rng.IntN(8))
				if rng.IntN(4) == 0 {
					tx.Delete(key)
					delete(objects[spec.Name], key)
					continue
				}
				byIndex := map[string][]Entry{}
				o := Object{Key: key}
				for _, ix := range spec.Indexes {
					var es []Entry
					for range rng.IntN(3) {
						es = append(es, e(fmt.Sprintf("k%d", rng.IntN(4)), fmt.Sprintf("v%d", rng.IntN(3))))
					}
					byIndex[ix] = slices.Clone(es)
					o.Entries = append(o.Entries, es)
				}
				tx.Put(o)
				objects[spec.Name][key] = byIndex
			}
			tx.Commit()
		}
	}
	s, _ := New()
	for round := range 200 {
		specs := randomSpecs()
		if _, err := s.Reconfigure(specs, nil); err != nil {
			t.Fatal(err)
		}
		// What a kept source holds for an index it kept stays; what it
		// holds for others is gone: forget it in the truth too.
		next := map[string]map[string]map[string][]Entry{}
		for _, spec := range specs {
			for key, byIndex := range objects[spec.Name] {
				if next[spec.Name] == nil {
					next[spec.Name] = map[string]map[string][]Entry{}
				}
				kept := map[string][]Entry{}
				for _, ix := range spec.Indexes {
					kept[ix] = byIndex[ix]
				}
				next[spec.Name][key] = kept
			}
		}
		objects = next
		write(s, specs)

		fresh, _ := New(specs...)
		for _, spec := range specs {
			var objs []Object
			for key, byIndex := range objects[spec.Name] {
				o := Object{Key: key}
				for _, ix := range spec.Indexes {
					o.Entries = append(o.Entries, slices.Clone(byIndex[ix]))
				}
				objs = append(objs, o)
			}
			fresh.Source(spec.Name).Replace(objs)
		}
		got, want := dumpAll(s.Snapshot(), allIndexes...), dumpAll(fresh.Snapshot(), allIndexes...)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d, specs %+v:\n got %v\nwant %v", round, specs, got, want)
		}
	}
}
