package indexer

import (
	"fmt"
	"testing"
)

// groupsProbed returns, for each count of groups that a lookup of a key
// of t probes to find it, how many keys take that many.
func groupsProbed(s *Store, t *table) map[int]int {
	out := map[int]int{}
	for pi := range 1 << t.bits {
		p := t.pageAt(pi)
		for gi := range p {
			for j := range p[gi].slots {
				if p[gi].ctrl>>(8*j)&0x80 == 0 {
					continue
				}
				h := s.hash(p[gi].slots[j].key())
				d := gi - home(uint32(h), len(p))
				if d < 0 {
					d += len(p)
				}
				out[d+1]++
			}
		}
	}
	return out
}

// TestKeysNearHome checks that pages laid out anew, by a build and by
// writes, place each key near its home group: filled in order of
// arrival, about 1 key in 40 of 10,000 AppModels' was 2 to 7 groups
// past home, and a lookup of it probed every one.
func TestKeysNearHome(t *testing.T) {
	s, err := New(SourceSpec{Name: "apps", Indexes: []string{"model-to-app"}})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("apps")
	const n = 10_000
	objs := appModelObjects(n, "ns/", false)
	src.Replace(objs)
	check := func(when string) {
		t.Helper()
		probes := groupsProbed(s, &s.current.Load().indexes[0].values)
		far, all := 0, 0
		for d, c := range probes {
			all += c
			if d > 2 {
				far += c
			}
		}
		t.Logf("%s: keys by groups probed %v", when, probes)
		if all != 3*n {
			t.Fatalf("%s: %d keys in the table, want %d", when, all, 3*n)
		}
		if far*100 > all {
			t.Errorf("%s: %d keys of %d are more than 2 groups from home (want under 1 %%)", when, far, all)
		}
	}
	check("built")
	// Writes that move every tenth object's keys: pages laid out anew
	// when they fill.
	for round := range 3 {
		tx := src.Begin()
		for i := round; i < n; i += 10 {
			name := fmt.Sprintf("app-%06d", i)
			var es []Entry
			for j := range 3 {
				es = append(es, Entry{Key: fmt.Sprintf("moved-%d-%06d-%d", round, i, j), Value: name})
			}
			tx.Put(Object{Key: "ns/" + name, Entries: [][]Entry{es}})
		}
		tx.Commit()
	}
	check("after writes")
}

// appModelObjects returns n objects shaped as the reference setup's
// AppModels are in its model-to-app index: key prefix + "app-NNNNNN", three
// model keys each whose value is the app's name, and, with meta, a
// resourceVersion and a creation time.
func appModelObjects(n int, prefix string, meta bool) []Object {
	objs := make([]Object, n)
	for i := range objs {
		name := fmt.Sprintf("app-%06d", i)
		es := make([]Entry, 0, 3)
		for j := range 3 {
			es = append(es, Entry{Key: fmt.Sprintf("model-%06d-%d", i, j), Value: name})
		}
		objs[i] = Object{Key: prefix + name, Entries: [][]Entry{es}}
		if meta {
			objs[i].Meta = Meta{Version: fmt.Sprint(1000000 + i), Created: 1764000000}
		}
	}
	return objs
}
