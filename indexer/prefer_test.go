package indexer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestPreferredFollowsWrites: after each of many random writes (values and
// hints of keys added, changed and removed, objects deleted, a relist, a
// reload that takes the hints away and one that gives them back), every
// preferring lookup answers what narrowing the key's values by its hints
// at the lookup answers (narrow, the rule as it was computed at each
// lookup before the answers were kept), for tags of zones, nodes, tags no
// hint carries and tags without a kind.
func TestPreferredFollowsWrites(t *testing.T) {
	spec := SourceSpec{Name: "slices", Indexes: []string{"eps", "eps/fallback", "eps/hints"},
		Fallbacks: map[string]string{"eps": "eps/fallback"}, Hints: map[string]string{"eps": "eps/hints"}}
	s, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("slices")
	r := rand.New(rand.NewPCG(7, 7))
	const services = 40
	tags := []string{"zone=a", "zone=b", "zone=c", "node=n1", "node=n2", "node=n3", "zone=", "rack=r1", "bad"}
	object := func(i int) Object {
		key := fmt.Sprintf("svc-%d", r.IntN(services))
		var values, fallback, hints []Entry
		for j := range r.IntN(6) {
			v := fmt.Sprintf("10.0.%d.%d", i%7, j)
			if r.IntN(10) == 0 {
				v += "\tx" // a value that holds a tab
			}
			values = append(values, Entry{Key: key, Value: v})
			for range r.IntN(3) {
				hints = append(hints, Entry{Key: key, Value: v + "\t" + tags[r.IntN(len(tags))]})
			}
		}
		if r.IntN(4) == 0 {
			fallback = append(fallback, Entry{Key: key, Value: "10.9.9.9"})
		}
		return Object{Key: fmt.Sprintf("ns/slice-%d", r.IntN(3*services)), Entries: [][]Entry{values, fallback, hints}}
	}
	check := func(step int) {
		t.Helper()
		snap := s.Snapshot()
		ix, _ := snap.Index("eps")
		hid, hinted := snap.conf.hints[ix.id]
		for k := range services {
			key := fmt.Sprintf("svc-%d", k)
			values, fromFallback := snap.lookupTier(ix, key)
			for _, prefer := range [][]string{nil, {"zone=a"}, {"node=n2", "zone=b"}, {"node=n9", "zone=c"}, {"bad", "zone="}, {"rack=r1"}, {"zone=q"}} {
				want := values
				if hinted && len(prefer) > 0 && len(values) > 0 && !fromFallback {
					want = narrow(values, snap.indexAt(hid).values.lookup(s.seed, key), prefer)
				}
				if got := snap.LookupPreferring(ix, key, prefer...); !slices.Equal(got, want) {
					t.Fatalf("step %d: %s preferring %q = %q, want %q", step, key, prefer, got, want)
				}
			}
		}
	}
	for step := range 3000 {
		switch n := r.IntN(100); {
		case n < 80:
			tx := src.Begin()
			for range 1 + r.IntN(3) {
				tx.Put(object(step))
			}
			tx.Commit()
		case n < 97:
			tx := src.Begin()
			tx.Delete(fmt.Sprintf("ns/slice-%d", r.IntN(3*services)))
			tx.Commit()
		case n < 98:
			objs := make([]Object, r.IntN(2*services))
			for i := range objs {
				objs[i] = object(step)
			}
			src.Replace(objs)
		case n < 99:
			plain := spec
			plain.Hints = nil
			if _, err := s.Reconfigure([]SourceSpec{plain}, nil); err != nil {
				t.Fatal(err)
			}
			check(step)
			if _, err := s.Reconfigure([]SourceSpec{spec}, nil); err != nil {
				t.Fatal(err)
			}
		default:
			s.compact(true)
		}
		check(step)
	}
}

// narrow applies prefer, as LookupPreferring did at each lookup before the
// answers were kept (the test's reference): to values with the hints of their key: hints are
// sorted "VALUE\tKIND=NAME" strings, so that the hints of the sorted
// values mostly come in their order, and one walk of both finds them. A
// value that holds a tab or a byte below it may sort its hints out of that
// order: a value the walk finds no hint of is looked for in all of them.
func narrow(values, hints []string, prefer []string) []string {
	if len(hints) == 0 {
		return values
	}
	for _, tag := range prefer {
		kind, _, ok := strings.Cut(tag, "=")
		if !ok {
			continue
		}
		var picked []string
		j, all := 0, true
		for _, v := range values {
			kindSeen, match := false, false
			see := func(h string) (cmp int) {
				cut := strings.LastIndexByte(h, '\t')
				if cut < 0 {
					return -1
				}
				if c := strings.Compare(h[:cut], v); c != 0 {
					return c
				}
				if t := h[cut+1:]; len(t) > len(kind) && t[len(kind)] == '=' && t[:len(kind)] == kind {
					kindSeen = true
					match = match || t == tag
				}
				return 0
			}
			for ; j < len(hints) && see(hints[j]) <= 0; j++ {
			}
			if !kindSeen {
				for _, h := range hints {
					see(h)
				}
			}
			if !kindSeen {
				all = false
				break
			}
			if match {
				picked = append(picked, v)
			}
		}
		if all && len(picked) > 0 {
			return slices.Clip(picked)
		}
	}
	return values
}
