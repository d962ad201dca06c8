package indexer

import (
	"encoding/binary"
	"slices"
	"strings"
	"unsafe"
)

// Answers that prefer a zone or a node, computed when they change.
//
// An index with hints (SourceSpec.Hints) keeps, beside its table, a
// second one: for each key whose hints apply to some tag ("zone=a",
// "node=n1"), the answer of each such tag, as LookupPreferring tells it
// (see preferredFor). A commit that changes a key's values or hints
// computes that key's answers again, before it publishes: a preferring
// lookup then costs a second probe, of this table, and a walk of the
// key's tags, and allocates nothing.
//
// Which keys a commit changed is read from the tables themselves, so that
// every way of writing (a transaction, a relist, a restore, a reload)
// keeps the answers: a page that the commit did not copy holds the same
// keys and values, and in one that it did, a key whose values did not
// change kept the same array of values.
//
// The answers of a key are one array of strings: a header, then the tags
// that apply, then the values each picks (the table's own strings). The
// header holds, for each tag, the hash of the tag (8 bytes), where its
// values start and how many there are (4 bytes each; allValues when it
// picks every value of the key, listed then not at all), so that a
// lookup finds a tag by reading one string, and compares the tag itself
// only once the hash matches.

// preferred is the table of an index's preferred answers, and its number
// of keys.
type preferred struct {
	t    table
	keys int
}

// allValues is the count of a tag that picks every value of its key.
const allValues = 1<<32 - 1

// headerEntry is the bytes of a tag in a header.
const headerEntry = 16

// preferredFor returns the preferred answers of a key of values and
// hints (both sorted, as the tables hold them), nil when no tag applies.
// A tag "KIND=NAME" applies when every value carries some tag of KIND
// and at least one carries this very tag; it picks the values that do.
func preferredFor(hs hashSeed, values, hints []string) []string {
	if len(values) == 0 || len(hints) == 0 {
		return nil
	}
	type tagged struct {
		tag   string
		value int // position in values
	}
	var buf [64]tagged
	ts := buf[:0]
	for _, h := range hints {
		cut := strings.LastIndexByte(h, '\t')
		if cut < 0 {
			continue
		}
		tag := h[cut+1:]
		if strings.IndexByte(tag, '=') < 0 {
			continue
		}
		if i, ok := slices.BinarySearch(values, h[:cut]); ok {
			ts = append(ts, tagged{tag, i})
		}
	}
	if len(ts) == 0 {
		return nil
	}
	slices.SortFunc(ts, func(a, b tagged) int {
		if c := strings.Compare(a.tag, b.tag); c != 0 {
			return c
		}
		return a.value - b.value
	})
	ts = slices.Compact(ts)
	// The kinds that every value carries: tags sort by kind (the part
	// before the first '=', which no kind holds), so each kind's tags are
	// a run.
	kindOf := func(tag string) string { return tag[:strings.IndexByte(tag, '=')] }
	covered := map[string]bool{}
	seen := make([]bool, len(values))
	for i := 0; i < len(ts); {
		kind := kindOf(ts[i].tag)
		clear(seen)
		n, j := 0, i
		for ; j < len(ts) && kindOf(ts[j].tag) == kind; j++ {
			if !seen[ts[j].value] {
				seen[ts[j].value] = true
				n++
			}
		}
		if n == len(values) {
			covered[kind] = true
		}
		i = j
	}
	type group struct {
		tag  string
		from int // in ts
		n    int
	}
	var groups []group
	picked := 0
	for i := 0; i < len(ts); {
		tag := ts[i].tag
		j := i
		for j < len(ts) && ts[j].tag == tag {
			j++
		}
		if covered[kindOf(tag)] {
			g := group{tag, i, j - i}
			if g.n == len(values) {
				g.n = allValues
			} else {
				picked += g.n
			}
			groups = append(groups, g)
		}
		i = j
	}
	if len(groups) == 0 {
		return nil
	}
	out := make([]string, 1+len(groups), 1+len(groups)+picked)
	header := make([]byte, 0, headerEntry*len(groups))
	for i, g := range groups {
		out[1+i] = g.tag
		start := len(out)
		if g.n != allValues {
			for _, t := range ts[g.from : g.from+g.n] {
				out = append(out, values[t.value])
			}
		}
		header = binary.LittleEndian.AppendUint64(header, hashKey(hs, g.tag))
		header = binary.LittleEndian.AppendUint32(header, uint32(start))
		header = binary.LittleEndian.AppendUint32(header, uint32(g.n))
	}
	out[0] = unsafe.String(unsafe.SliceData(header), len(header))
	return out
}

// pick returns the answer of the first tag of prefer that applies, from a
// key's preferred answers, or values when none does.
func pick(hs hashSeed, answers, values, prefer []string) []string {
	if len(answers) == 0 {
		return values
	}
	header := answers[0]
	for _, tag := range prefer {
		h := hashKey(hs, tag)
		for at := 0; at+headerEntry <= len(header); at += headerEntry {
			if le64(header, at) != h || answers[1+at/headerEntry] != tag {
				continue
			}
			n := int(le32(header, at+12))
			if n == allValues {
				return values
			}
			from := int(le32(header, at+8))
			return answers[from : from+n : from+n]
		}
	}
	return values
}

// publishPreferred gives each index that has hints in next the preferred
// answers of its values and hints in next, from those of prev (computed
// again only for the keys whose values or hints differ), and drops those
// of an index that no longer has hints.
func (s *Store) publishPreferred(prev, next *Snapshot) {
	if len(next.conf.hints) == 0 && len(prev.conf.hints) == 0 {
		return
	}
	cloned := false
	set := func(id int, p *preferred) {
		is := next.indexes[id]
		if is.preferred == p {
			return
		}
		if !cloned {
			next.indexes, cloned = slices.Clone(next.indexes), true
		}
		c := *is
		c.preferred = p
		next.indexes[id] = &c
	}
	if prev.conf != next.conf {
		for id, is := range next.indexes {
			if _, hinted := next.conf.hints[id]; !hinted && is.preferred != nil {
				set(id, nil)
			}
		}
	}
	for id, h := range next.conf.hints {
		is, hs := next.indexAt(id), next.indexAt(h)
		if is == emptyIndex {
			continue
		}
		ph, ok := prev.conf.hints[id]
		set(id, s.preferredOf(ok && ph == h, prev.indexAt(id), prev.indexAt(h), is, hs))
	}
}

// preferSource gives the states of src's hinted indexes that a commit of
// src changed (states[i], nil: unchanged, of its i-th index) their
// preferred answers, from those src last published. Under src.mu, which
// alone publishes the source's states anew (a Reconfigure, which changes
// which index has hints, takes it too): the work is the source's own, and
// its publication then costs other sources' writers nothing.
func (s *Store) preferSource(src *Source, states []*indexSnap) []*indexSnap {
	old := s.current.Load()
	if len(old.conf.hints) == 0 {
		return states
	}
	at := func(i int) *indexSnap {
		if i >= 0 && i < len(states) {
			return states[i]
		}
		return nil
	}
	out, copied := states, false // the caller's, copied before a change
	for i, id := range src.indexes {
		h, ok := old.conf.hints[id]
		if !ok {
			continue
		}
		j := slices.Index(src.indexes, h)
		if at(i) == nil && at(j) == nil {
			continue
		}
		pv, ph := old.indexAt(id), old.indexAt(h)
		is, hs := pv, ph
		if at(i) != nil {
			is = at(i)
		}
		if at(j) != nil {
			hs = at(j)
		}
		if is == emptyIndex {
			continue
		}
		p := s.preferredOf(true, pv, ph, is, hs)
		if p == is.preferred {
			continue
		}
		if !copied {
			out, copied = make([]*indexSnap, len(src.indexes)), true
			copy(out, states)
		}
		c := *is
		c.preferred = p
		out[i] = &c
	}
	return out
}

// preferredOf returns the preferred answers of an index in state is, whose
// hints are in state hs, from those of its state pv (hints ph): computed
// again only for the keys whose values or hints differ, or for every key
// when the tables were rebuilt or samePlan is false (pv's configuration
// gave the index other hints, or none).
func (s *Store) preferredOf(samePlan bool, pv, ph, is, hs *indexSnap) *preferred {
	if !samePlan || pv.values.bits != is.values.bits || ph.values.bits != hs.values.bits {
		return buildPreferred(s.seed, is.values, hs.values)
	}
	base := pv.preferred
	var changes []change
	seen := map[string]bool{}
	see := func(key string) {
		if seen[key] {
			return
		}
		seen[key] = true
		answers := preferredFor(s.seed, is.values.lookup(s.seed, key), hs.values.lookup(s.seed, key))
		if answers == nil && (base == nil || base.t.lookup(s.seed, key) == nil) {
			return
		}
		changes = append(changes, change{hash: s.hash(key), key: key, values: answers})
	}
	changedKeys(s.seed, &pv.values, &is.values, see)
	changedKeys(s.seed, &ph.values, &hs.values, see)
	if len(changes) == 0 {
		return base
	}
	if base == nil {
		base = &preferred{t: newTable(0)}
	}
	t, delta := base.t.update(s.seed, changes)
	p := &preferred{t: t, keys: base.keys + delta}
	if p.keys == 0 {
		p = nil
	} else if bits := bitsFor(p.keys); bits > p.t.bits+1 || bits+1 < p.t.bits {
		p.t = p.t.rehash(bits, s.hash)
	}
	return p
}

// buildPreferred computes the preferred answers of every key of values.
func buildPreferred(hs hashSeed, values, hints table) *preferred {
	var changes []change
	values.all(func(key string, vs []string) {
		if answers := preferredFor(hs, vs, hints.lookup(hs, key)); answers != nil {
			changes = append(changes, change{hash: hashKey(hs, key), key: key, values: answers})
		}
	})
	if len(changes) == 0 {
		return nil
	}
	bits := bitsFor(len(changes))
	return &preferred{t: build(bits, changes), keys: len(changes)}
}

// changedKeys calls f with every key whose values differ between two
// tables of the same bits, one derived from the other: the keys of the
// pages that differ whose values are not the same array.
func changedKeys(hs hashSeed, was, now *table, f func(key string)) {
	if len(was.dir) > 0 && len(now.dir) > 0 && &was.dir[0] == &now.dir[0] {
		return
	}
	for ci := range now.dir {
		if was.dir[ci] == now.dir[ci] {
			continue
		}
		for pi := range now.dir[ci] {
			old, cur := was.dir[ci][pi], now.dir[ci][pi]
			if len(old) > 0 && len(cur) > 0 && &old[0] == &cur[0] {
				continue
			}
			diffPage(hs, old, cur, f)
			diffPage(hs, cur, old, f)
		}
	}
}

// diffPage calls f with each key of page a that page b lacks or holds
// with other values.
func diffPage(hs hashSeed, a, b []group, f func(key string)) {
	for g := range a {
		for j := range a[g].slots {
			if a[g].ctrl>>(8*j)&0x80 == 0 {
				continue
			}
			s := &a[g].slots[j]
			bg, bj := find(b, slotHash(hs, s), s.key())
			if bg < 0 || b[bg].slots[bj].vptr != s.vptr || b[bg].slots[bj].vlen != s.vlen {
				f(s.key())
			}
		}
	}
}
