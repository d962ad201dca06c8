package indexer

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestObjectSetMatchesMap: random puts (new keys and replacements) and
// deletes, through growth and shrinking, against a map; after each step
// every key of the map is found with its encoding, the count agrees, and
// All yields exactly the map.
func TestObjectSetMatchesMap(t *testing.T) {
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, seed))
		m := newObjectSet(newHashSeed(seed), 0)
		want := map[string]string{}
		// Few distinct keys in some seeds (dense clusters, many shifts),
		// many in others (growth and shrinking).
		space := []int{20, 3000}[seed%2]
		for step := range 6000 {
			key := fmt.Sprintf("ns/obj-%d", r.IntN(space))
			if step > 4000 {
				// Drain: the table shrinks.
				if _, ok := want[key]; ok || r.IntN(4) > 0 {
					m.Delete(key)
					delete(want, key)
					continue
				}
			}
			if r.IntN(3) == 0 {
				m.Delete(key)
				delete(want, key)
			} else {
				entries := [][]Entry{{{Key: fmt.Sprint("k", step), Value: "v"}}}
				rec, k, enc := newRecord(key, encodeMeta(nil, Meta{Version: fmt.Sprint(step)}), entries)
				if k != key {
					t.Fatalf("record's key %q, want %q", k, key)
				}
				_, had := want[key]
				if isNew := m.Put(rec); isNew == had {
					t.Fatalf("step %d: Put(%q) new %v, had %v", step, key, isNew, had)
				}
				want[key] = enc
			}
			if m.Len() != len(want) {
				t.Fatalf("step %d: Len %d, want %d", step, m.Len(), len(want))
			}
			if step%97 == 0 || step > 5900 {
				for k, enc := range want {
					if got, ok := m.Get(k); !ok || got != enc {
						t.Fatalf("step %d: Get(%q) = %q, %v; want %q", step, k, got, ok, enc)
					}
				}
				seen := 0
				for k, enc := range m.All() {
					if want[k] != enc {
						t.Fatalf("step %d: All yields %q, %q; want %q", step, k, enc, want[k])
					}
					seen++
				}
				if seen != len(want) {
					t.Fatalf("step %d: All yields %d, want %d", step, seen, len(want))
				}
			}
		}
		if _, ok := m.Get("ns/absent"); ok {
			t.Fatal("found an absent key")
		}
		if len(m.slots) > slotsFor(m.Len())*8 {
			t.Fatalf("%d slots hold %d objects: the table did not shrink", len(m.slots), m.Len())
		}
	}
}

// TestRecordLongParts: object keys and encodings past one byte's varint
// length split back exactly.
func TestRecordLongParts(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 300, 20000} {
		key := fmt.Sprintf("%0*d", max(n, 1), 7)
		entries := [][]Entry{{{Key: key + "k", Value: key}}}
		rec, k, enc := newRecord(key, encodeMeta(nil, Meta{Version: key}), entries)
		if k != key {
			t.Fatalf("n=%d: key %d bytes, want %d", n, len(k), len(key))
		}
		if got := recordAt(&[]byte(rec)[0]); got != rec {
			t.Fatalf("n=%d: recordAt reads %d bytes of %d", n, len(got), len(rec))
		}
		if es := decode(enc, k, 1); len(es[0]) != 1 || es[0][0] != entries[0][0] {
			t.Fatalf("n=%d: decoded %v", n, es)
		}
		if m := decodeMeta(enc); m.Version != key {
			t.Fatalf("n=%d: version %d bytes, want %d", n, len(m.Version), len(key))
		}
	}
}
