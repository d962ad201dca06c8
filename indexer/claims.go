package indexer

import (
	"slices"
	"strings"
)

// Finding a key's claimants without reading every object.
//
// A key of a unique index with one value keeps no claims (see settle):
// when a second value comes, the writer must learn who gives the first.
// Reading every object of the source for that costs the source's size
// under the source's writer lock, at every key a claimant moves to. Most unique
// indexes name their claimant in the value (a model's value is the app
// that serves it, `metadata.name`), which the encoding already marks
// (sameAsObjectName, sameAsObjectKey): the claimants of such a value are
// found among a few object keys, the value itself and the value under
// each namespace prefix the source has seen, each read and checked. The
// duplicate counts tell how many objects give each value, so the writer
// knows whether those it found are all; when they are not (a value that
// names no claimant), it reads every object as before.
//
// A source that keeps the object keys behind each index key
// (SourceSpec.Objects: the engine keeps them for a resource with fields or
// of several clusters) reads a key's claimants from there (claimsOf), for
// any value: none of the above, and never every object.
//
// What this keeps: the distinct prefixes of the source's object keys (its
// namespaces), at most maxPrefixes of them, nothing per object or key.

// maxPrefixes bounds the object key prefixes a source keeps: past it, the
// source forgets them and finds claimants by reading every object, until
// its next relist.
const maxPrefixes = 64

// prefixSet is the distinct prefixes (up to and including the first '/')
// of the object keys a source has held since its last relist: never
// shrunk by a delete, so it may hold some that no object has now, which
// cost a lookup that finds nothing.
type prefixSet struct {
	set  map[string]struct{}
	full bool // more than maxPrefixes were seen: set is dropped
}

// note adds the prefix of an object key.
func (ps *prefixSet) note(objectKey string) {
	if ps.full {
		return
	}
	j := strings.IndexByte(objectKey, '/')
	if j < 0 {
		return
	}
	p := objectKey[:j+1]
	if _, ok := ps.set[p]; ok {
		return
	}
	if len(ps.set) >= maxPrefixes {
		ps.set, ps.full = nil, true
		return
	}
	if ps.set == nil {
		ps.set = map[string]struct{}{}
	}
	ps.set[strings.Clone(p)] = struct{}{}
}

// reset empties the set.
func (ps *prefixSet) reset() { *ps = prefixSet{} }

// claimsOf returns the claims on key of the source's i-th index, a unique
// one, from objects, the object keys that the source lists under the key
// (SourceSpec.Objects); under src.mu, with the objects as the transaction
// left them. It reads those objects only.
func (src *Source) claimsOf(i int, key string, objects []string) []claim {
	var out []claim
	buf := make([][]Entry, len(src.indexes))
	var room []byte
	for _, object := range objects {
		enc, ok := src.objects.Get(object)
		if !ok {
			continue
		}
		created := createdOf(enc)
		for _, e := range decodeIn(buf, enc, object, &room)[i] {
			if e.Key == key {
				out = append(out, claim{object: strings.Clone(object), value: strings.Clone(e.Value), created: created})
			}
		}
	}
	return out
}

// claimsByName returns the claims on key of the source's i-th index, a
// unique one, whose values after the transaction are raw, from the
// objects that its values name (see above), and whether they are all of
// its claims; under src.mu, with the objects as the transaction left them.
func (src *Source) claimsByName(i int, key string, raw []string) ([]claim, bool) {
	ps := &src.prefixes
	if ps.full || len(raw)*(1+len(ps.set)) > max(256, src.objects.Len()/8) {
		return nil, false // reading every object costs about as much
	}
	var tried []string
	try := func(object string) {
		if !slices.Contains(tried, object) {
			tried = append(tried, object)
		}
	}
	for _, v := range raw {
		try(v)
		for p := range ps.set {
			try(p + v)
		}
	}
	out := src.claimsOf(i, key, tried)
	// All of them when each value has as many claimants as objects give
	// it: one, and its duplicates.
	for _, v := range raw {
		want := 1
		if d := src.dups[i][Entry{Key: key, Value: v}]; d != nil {
			want += int(*d)
		}
		n := 0
		for _, c := range out {
			if c.value == v {
				n++
			}
		}
		if n != want {
			return nil, false
		}
	}
	return out, true
}
