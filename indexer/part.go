package indexer

import (
	"slices"
	"strings"
)

// A part of an answer: what some of the objects behind a key give it.
//
// A source whose objects fall into parts (metasync's: one per cluster,
// told by the object key's prefix) is read a part at a time without any
// table per part: the object keys behind each index key (SourceSpec.
// Objects) tell whose a key's values are. When they are all of the part,
// or none, the answer is the lookup's, or nothing, and nothing is read or
// allocated; only a key that objects of several parts give reads those
// of the part (each a lookup in the source's objects and a decode of
// its record). A source with SourceSpec.Parts also tells each commit's
// keys whose givers changed while their values did not, so that a
// reader of a part hears of a change of it.

// Part returns what of key's answer in ix (Lookup's: the index's values,
// or its fallback's when it has none of its own; of a unique key, the
// chosen claimant's) the objects that owns accepts give: distinct and
// sorted; the answer's own slice when every object behind the key is
// accepted, nil when none is. It needs the object keys behind each key,
// which a source keeps with SourceSpec.Objects or Parts: without them,
// nil. A part that is not the whole answer is the caller's own.
func (snap *Snapshot) Part(ix Index, key string, owns func(objectKey string) bool) []string {
	values, fromFallback := snap.lookupTier(ix, key)
	if len(values) == 0 {
		return nil
	}
	id := ix.id
	if fromFallback {
		id, _ = snap.conf.companions(ix.id)
	}
	is := snap.indexAt(id)
	if is.objects == nil {
		return nil
	}
	objs := is.objects.lookup(snap.s.seed, key)
	mine := 0
	for _, o := range objs {
		if owns(o) {
			mine++
		}
	}
	switch mine {
	case 0:
		return nil
	case len(objs):
		return values
	}
	src, pos := snap.objectsOf(id)
	if src == nil {
		return nil
	}
	// Of a unique key in conflict, only the chosen claimant's values
	// are answered: the others' are left out.
	conflict := is.chosen.has(snap.s.seed, key)
	buf := make([][]Entry, len(src.indexes))
	var room []byte
	var out, run []string
	for _, o := range objs {
		if !owns(o) {
			continue
		}
		enc, ok := src.set.get(o)
		if !ok {
			continue
		}
		// An object's entries are sorted and distinct: its values of
		// key are a sorted run, merged into the others'.
		es := decodeIn(buf, enc, o, &room)[pos]
		from, _ := slices.BinarySearchFunc(es, key, func(e Entry, k string) int { return strings.Compare(e.Key, k) })
		run = run[:0]
		for _, e := range es[from:] {
			if e.Key != key {
				break
			}
			if conflict {
				if _, in := slices.BinarySearch(values, e.Value); !in {
					continue
				}
			}
			run = append(run, e.Value)
		}
		out = mergeSorted(out, run)
	}
	// The values are parts of records: copies, so that an answer kept
	// (a subscription's last) never keeps an object's old record.
	for i, v := range out {
		out[i] = strings.Clone(v)
	}
	return out
}

// mergeSorted returns the distinct strings of a and b, both sorted and
// distinct, sorted: a itself when b is empty, else a new slice.
func mergeSorted(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	if len(a) == 0 {
		return slices.Clone(b)
	}
	out := make([]string, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch c := strings.Compare(a[i], b[j]); {
		case c < 0:
			out = append(out, a[i])
			i++
		case c > 0:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	out = append(out, a[i:]...)
	return slices.Clip(append(out, b[j:]...))
}

// get returns the encoding of the object key's object, as find does in
// the set the view was frozen from.
func (v *objectView) get(key string) (enc string, ok bool) {
	if len(v.pages) == 0 {
		return "", false
	}
	per := 1 << v.shift
	mask := len(v.pages)*per - 1
	for i := int(hashKey(v.seed, key)) & mask; ; i = (i + 1) & mask {
		p := v.pages[i>>v.shift].slots[i&(per-1)]
		if p == nil {
			return "", false
		}
		if k, e := splitRecord(recordAt(p)); k == key {
			return e, true
		}
	}
}
