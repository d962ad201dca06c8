package indexer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// checkTable compares t with model: every key found with its values, no
// other key, no key twice, control bytes agree with hashes.
func checkTable(t *testing.T, hs hashSeed, tb *table, model map[string][]string, ctx string) {
	t.Helper()
	seen := map[string]int{}
	tb.all(func(k string, v []string) {
		seen[k]++
		if !slices.Equal(v, model[k]) {
			t.Fatalf("%s: all(): %q = %v, want %v", ctx, k, v, model[k])
		}
	})
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("%s: key %q held %d times", ctx, k, n)
		}
	}
	if len(seen) != len(model) {
		t.Fatalf("%s: %d keys, want %d", ctx, len(seen), len(model))
	}
	for k, v := range model {
		if got := tb.lookup(hs, k); !slices.Equal(got, v) {
			t.Fatalf("%s: lookup(%q) = %v, want %v", ctx, k, got, v)
		}
	}
	// Long keys: the hash stored before the key must be the key's hash.
	for _, c := range tb.dir {
		for _, p := range c {
			for g := range p {
				for j := range p[g].slots {
					if p[g].ctrl>>(8*j)&0x80 == 0 {
						continue
					}
					s := &p[g].slots[j]
					if h := slotHash(hs, s); h != hashKey(hs, s.key()) {
						t.Fatalf("%s: slotHash(%q) stale", ctx, s.key())
					}
				}
			}
		}
	}
}

func keyOf(r *rand.Rand, i int) string {
	switch r.IntN(4) {
	case 0:
		return fmt.Sprintf("k%d", i) // short (<8)
	case 1:
		return fmt.Sprintf("model-%08d", i)
	case 2:
		return fmt.Sprintf("%d-", i) + strings.Repeat("x", 63-len(fmt.Sprint(i))) // 64/65 bytes
	default:
		return fmt.Sprintf("long-%d-", i) + strings.Repeat("L", 60+r.IntN(200))
	}
}

// TestRelayoutRandom: a single-page table (bits 0) driven through
// random commits of inserts, updates and deletes, sized up to ~300 keys
// so that relayouts cross 128/129 keys.
func TestRelayoutRandom(t *testing.T) {
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		hs := newHashSeed(seed)
		tb := newTable(0)
		model := map[string][]string{}
		var universe []string
		for i := range 400 {
			universe = append(universe, keyOf(r, i))
		}
		target := 50 + r.IntN(300)
		for step := range 300 {
			n := 1 + r.IntN(40)
			if r.IntN(10) == 0 {
				n = len(universe) // every key changed
			}
			picked := map[string]bool{}
			var changes []change
			for range n {
				k := universe[r.IntN(len(universe))]
				if picked[k] {
					continue
				}
				picked[k] = true
				var vals []string
				del := len(model) > target && r.IntN(2) == 0 || r.IntN(5) == 0
				if !del {
					vals = []string{fmt.Sprintf("v%d-%d", step, r.IntN(3))}
				}
				// borrowed key: a copy that we then scribble over
				kb := []byte(k)
				changes = append(changes, change{hash: hashKey(hs, k), key: string(kb), values: vals})
			}
			var before = len(model)
			for _, c := range changes {
				if c.values == nil {
					delete(model, c.key)
				} else {
					model[c.key] = c.values
				}
			}
			next, d := tb.update(hs, changes)
			if before+d != len(model) {
				t.Fatalf("seed %d step %d: delta %d, want %d", seed, step, d, len(model)-before)
			}
			tb = next
			checkTable(t, hs, &tb, model, fmt.Sprintf("seed %d step %d (%d keys)", seed, step, len(model)))
		}
	}
}

// TestRelayoutBoundary: pages of exactly 127..130 keys laid out anew by
// one insert, one delete, and all keys changed.
func TestRelayoutBoundary(t *testing.T) {
	hs := newHashSeed(3)
	for _, n := range []int{56, 112, 126, 127, 128, 129, 130, 200, 255, 256, 257} {
		for _, long := range []bool{false, true} {
			mk := func(i int) string {
				if long {
					return fmt.Sprintf("%06d", i) + strings.Repeat("z", 80)
				}
				return fmt.Sprintf("model-%06d", i)
			}
			var cs []change
			model := map[string][]string{}
			for i := range n {
				k := mk(i)
				cs = append(cs, change{hash: hashKey(hs, k), key: k, values: []string{"a"}})
				model[k] = []string{"a"}
			}
			base := newTable(0)
			base, _ = base.update(hs, cs)
			checkTable(t, hs, &base, model, fmt.Sprintf("n=%d build", n))
			// Grow one key at a time until well past, each time checking.
			tb := base
			m := map[string][]string{}
			for k, v := range model {
				m[k] = v
			}
			for i := n; i < n+140; i++ {
				k := mk(i)
				tb, _ = tb.update(hs, []change{{hash: hashKey(hs, k), key: k, values: []string{"b"}}})
				m[k] = []string{"b"}
				checkTable(t, hs, &tb, m, fmt.Sprintf("n=%d grow %d", n, i))
			}
			// Every key changed, half deleted, plus new ones, in one commit.
			var all []change
			for k := range m {
				var v []string
				if len(k)%2 == 0 || k[len(k)-1]%2 == 0 {
					v = []string{"c"}
				}
				all = append(all, change{hash: hashKey(hs, k), key: k, values: v})
			}
			for i := n + 140; i < n+200; i++ {
				k := mk(i)
				all = append(all, change{hash: hashKey(hs, k), key: k, values: []string{"d"}})
			}
			for _, c := range all {
				if c.values == nil {
					delete(m, c.key)
				} else {
					m[c.key] = c.values
				}
			}
			tb, _ = tb.update(hs, all)
			checkTable(t, hs, &tb, m, fmt.Sprintf("n=%d long=%v all changed", n, long))
			// Shrink by deletes to 0.
			for k := range m {
				tb, _ = tb.update(hs, []change{{hash: hashKey(hs, k), key: k}})
				delete(m, k)
				checkTable(t, hs, &tb, m, fmt.Sprintf("n=%d shrink", n))
			}
		}
	}
}
