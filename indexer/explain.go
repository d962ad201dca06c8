package indexer

import (
	"slices"
	"sort"
)

// Claim is what one object gives one key of an index: the values, and
// where they come from. Explain's answer. Its strings are parts of what
// the source keeps of the object (one record each): an answer kept for
// long keeps those records alive; copy what outlives a request.
type Claim struct {
	Object string // object key
	Meta   Meta
	Values []string // distinct, sorted
	// Chosen marks, on a key in conflict in a unique index, the claimant
	// whose values the key answers.
	Chosen bool
	// Fallback: these are values of the index's fallback
	// (SourceSpec.Fallbacks): answered when the key has no values of its
	// own, else Shadowed: not answered, since it has.
	Fallback, Shadowed bool
}

// Explainer tells which objects give the keys of an index their values,
// in the state of one snapshot.
type Explainer struct {
	snap *Snapshot
}

// Explain calls f with an Explainer of the current snapshot. It takes no
// lock: the snapshot holds each source's objects as its commit left them
// (the writer copies a page of its set of objects before it changes one
// that a snapshot holds), so writers never wait for an explanation, and
// an explanation never sees a later write.
//
// Provenance is not on a lookup's path: each object's encoding keeps its
// Meta beside its entries, and Claims finds the objects of a key by
// reading them all, which costs no memory per key.
func (s *Store) Explain(f func(x *Explainer)) {
	f(&Explainer{snap: s.current.Load()})
}

// claimsHook, when set (by tests), is called by Claims in the middle of
// its read of the objects.
var claimsHook func()

// Snapshot returns the state that the Explainer explains.
func (x *Explainer) Snapshot() *Snapshot { return x.snap }

// Claims returns, for each of keys, the objects that give it the values
// that a lookup answers in ix, oldest first (by Meta.Created, then by
// object key): those of ix, or of its fallback when the key has none of
// its own. A key that has no values has no claims. Hints do not narrow
// what Claims tells.
func (x *Explainer) Claims(ix Index, keys []string) map[string][]Claim {
	out := map[string][]Claim{}
	src, pos := x.snap.objectsOf(ix.id)
	if src == nil || len(keys) == 0 {
		return out
	}
	seed := x.snap.s.seed
	is := x.snap.index(ix)
	fb, _ := x.snap.conf.companions(ix.id)
	fbPos := -1
	if fb >= 0 {
		fbPos = slices.Index(src.indexes, fb)
	}
	// The position that answers each key: the index's, or its fallback's;
	// with a fallback, the fallback's values of a key that has values of
	// its own are told too, as shadowed.
	from := map[string]int{}
	shadowed := map[string]bool{}
	for _, k := range keys {
		switch {
		case len(is.values.lookup(seed, k)) > 0:
			from[k] = pos
			shadowed[k] = fbPos >= 0 && len(x.snap.indexAt(fb).values.lookup(seed, k)) > 0
		case fbPos >= 0 && len(x.snap.indexAt(fb).values.lookup(seed, k)) > 0:
			from[k] = fbPos
		}
	}
	if len(from) == 0 {
		return out
	}
	buf := make([][]Entry, len(src.indexes))
	var room []byte // the keys decodeIn rebuilds, for the whole scan
	read := 0
	for object, enc := range src.set.All() {
		if read++; read == 1+src.set.n/2 && claimsHook != nil {
			claimsHook()
		}
		es := decodeIn(buf, enc, object, &room)
		var meta *Meta
		for _, p := range []int{pos, fbPos} {
			if p < 0 {
				continue
			}
			for _, e := range es[p] {
				at, ok := from[e.Key]
				shadow := p == fbPos && at == pos && shadowed[e.Key]
				if !ok || at != p && !shadow {
					continue
				}
				if meta == nil {
					m := decodeMeta(enc)
					meta = &m
				}
				cl := out[e.Key]
				if n := len(cl); n > 0 && cl[n-1].Object == object && cl[n-1].Fallback == (p != pos) {
					cl[n-1].Values = append(cl[n-1].Values, e.Value)
				} else {
					cl = append(cl, Claim{Object: object, Meta: *meta, Values: []string{e.Value}, Fallback: p != pos, Shadowed: shadow})
				}
				out[e.Key] = cl
			}
		}
	}
	for key, cl := range out {
		sort.Slice(cl, func(a, b int) bool {
			return older(claim{object: cl[a].Object, created: cl[a].Meta.Created}, claim{object: cl[b].Object, created: cl[b].Meta.Created})
		})
		if is.chosen.has(seed, key) && len(cl) > 0 {
			cl[0].Chosen = true // the oldest, as choose chose
		}
	}
	return out
}

// objectsOf returns the objects of the live source that feeds index id
// in snap, and the index's position among its indexes.
func (snap *Snapshot) objectsOf(id int) (*sourceObjects, int) {
	for _, so := range snap.objects {
		if so == nil {
			continue
		}
		if p := slices.Index(so.indexes, id); p >= 0 {
			return so, p
		}
	}
	return nil, -1
}
