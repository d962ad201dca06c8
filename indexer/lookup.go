package indexer

// Reading a snapshot: lookups, with and without a locality, chains,
// keys, objects and payloads. Everything here reads a published snapshot
// and never blocks a write.

import (
	"hash/maphash"
	"slices"
	"sort"
)

// Lookup returns the values of key in the named index: distinct, sorted,
// nil when there are none or the index is unknown. The slice is shared:
// callers must not modify its elements; it has no spare capacity, so an
// append gets an array of its own.
func (s *Store) Lookup(index, key string) []string {
	snap := s.current.Load()
	id, ok := snap.conf.names[index]
	if !ok || id < len(snap.conf.companion) && snap.conf.companion[id] {
		return nil
	}
	values := snap.indexes[id].values.lookup(s.seed, key)
	if len(values) == 0 {
		if fb, _ := snap.conf.companions(id); fb >= 0 {
			return snap.indexes[fb].values.lookup(s.seed, key)
		}
	}
	return values
}

// Lookup returns the values of key in this index; see Store.Lookup. A key
// that has no values in an index with a fallback (SourceSpec.Fallbacks)
// answers its values in the fallback, both read from one snapshot: a
// commit that moves a key's values from one to the other (every endpoint
// of a service terminating, or one ready again) never shows the key
// empty. It allocates nothing and takes no lock.
func (ix Index) Lookup(key string) []string {
	// A state published with a fallback or hints for the index, or the
	// shared empty one (a new index whose head is not stored yet, or a
	// retired one): the current snapshot answers.
	if is := ix.head.Load(); !is.served && is != emptyIndex {
		return is.values.lookup(ix.seed, key)
	}
	return ix.s.current.Load().Lookup(ix, key)
}

// hash returns the hash of an index key.
func (s *Store) hash(key string) uint64 { return hashKey(s.seed, key) }

// shardOf picks an object key's payload shard: the top bits of a hash
// seeded per Store. The choice only spreads the cost of writes (a write
// copies each shard it changes), but names that anyone who may create
// objects chooses must not be able to put every payload in one shard,
// which an unseeded hash of a few of their bytes allowed: each update then
// copied every payload. The shards are rebuilt whenever a source is built
// (a warm start included): no shard choice is ever stored.
func (s *Store) shardOf(key string) int {
	return int(maphash.String(s.shardSeed, key) >> 56)
}

// Lookup returns the values of key in ix as of this snapshot, or of its
// fallback when ix has none.
func (snap *Snapshot) Lookup(ix Index, key string) []string {
	values, _ := snap.lookupTier(ix, key)
	return values
}

// lookupTier is Lookup, and whether the values came from the fallback.
func (snap *Snapshot) lookupTier(ix Index, key string) (values []string, fromFallback bool) {
	values = snap.index(ix).values.lookup(snap.s.seed, key)
	if len(values) == 0 {
		if fb, _ := snap.conf.companions(ix.id); fb >= 0 {
			return snap.indexAt(fb).values.lookup(snap.s.seed, key), true
		}
	}
	return values, false
}

// LookupPreferring returns the values of key in ix as of this snapshot
// (as Lookup does), narrowed by the index's hints (SourceSpec.Hints) to
// the values tagged with the first tag of prefer that applies. Each tag is
// "KIND=NAME" ("zone=a"); a tag applies when every value of the answer
// carries some tag of its KIND and at least one carries this very tag.
// When none applies, or the index has no hints, or prefer is empty, the
// answer is Lookup's: hints that are missing, or that would leave nothing,
// never narrow an answer. The narrowed answers are computed when a key's
// values or hints change (see prefer.go): a lookup reads them, and
// allocates nothing.
//
// Values that come from the fallback are never narrowed: kube-proxy
// applies topology to ready endpoints only, and falls back to every
// serving terminating one.
func (snap *Snapshot) LookupPreferring(ix Index, key string, prefer ...string) []string {
	is := snap.index(ix)
	values := is.values.lookup(snap.s.seed, key)
	if len(values) == 0 {
		if fb, _ := snap.conf.companions(ix.id); fb >= 0 {
			return snap.indexAt(fb).values.lookup(snap.s.seed, key)
		}
		return values
	}
	if len(prefer) == 0 || is.preferred == nil {
		return values
	}
	return pick(snap.s.seed, is.preferred.t.lookup(snap.s.seed, key), values, prefer)
}

// Hints returns the hints of key in ix as of this snapshot
// (SourceSpec.Hints): one string per value and tag, "VALUE\tKIND=NAME",
// shared (do not modify); nil when ix has no hints.
func (snap *Snapshot) Hints(ix Index, key string) []string {
	if _, h := snap.conf.companions(ix.id); h >= 0 {
		return snap.indexAt(h).values.lookup(snap.s.seed, key)
	}
	return nil
}

// indexAt returns the state of index id in snap (see index).
func (snap *Snapshot) indexAt(id int) *indexSnap {
	if id >= len(snap.indexes) {
		return emptyIndex
	}
	return snap.indexes[id]
}

// index returns the state of ix in snap: empty when ix was made by a
// later Reconfigure than snap's.
func (snap *Snapshot) index(ix Index) *indexSnap { return snap.indexAt(ix.id) }

// source returns the state of src in snap: empty when src was made by a
// later Reconfigure than snap's.
func (snap *Snapshot) source(src *Source) *sourceSnap {
	if src.id >= len(snap.sources) {
		return &sourceSnap{}
	}
	return snap.sources[src.id]
}

// Objects returns the object keys of the objects that contribute under key
// in ix: distinct, sorted, shared (do not modify). It is nil unless the
// source was declared with SourceSpec.Objects.
//
// With a fallback, they are the objects behind the values that Lookup
// answers: those of ix, or of its fallback when ix has none.
func (snap *Snapshot) Objects(ix Index, key string) []string {
	is := snap.index(ix)
	if fb, _ := snap.conf.companions(ix.id); fb >= 0 && len(is.values.lookup(snap.s.seed, key)) == 0 {
		is = snap.indexAt(fb)
	}
	if is.objects == nil {
		return nil
	}
	if c, ok := is.chosen.get(snap.s.seed, key); ok {
		// A key in conflict answers one claimant: its object.
		return []string{c.object}
	}
	return is.objects.lookup(snap.s.seed, key)
}

// SameCompanions reports whether ix reads the same fallback and hints
// indexes in snap as in other (a Reconfigure that drops or replaces one
// changes what ix answers, though no commit names its keys).
func (snap *Snapshot) SameCompanions(other *Snapshot, ix Index) bool {
	if snap.conf == other.conf {
		return true
	}
	fb, h := snap.conf.companions(ix.id)
	ofb, oh := other.conf.companions(ix.id)
	return fb == ofb && h == oh
}

// KeyCount returns the number of index keys in ix (with a fallback, the
// keys of either).
func (snap *Snapshot) KeyCount(ix Index) int {
	is := snap.index(ix)
	fb, _ := snap.conf.companions(ix.id)
	if fb < 0 {
		return is.keys
	}
	n := is.keys
	snap.indexAt(fb).values.all(func(key string, _ []string) {
		if len(is.values.lookup(snap.s.seed, key)) == 0 {
			n++
		}
	})
	return n
}

// Keys returns every index key of ix, sorted. The keys are sorted once per
// published state of the index, at the first call, and shared by every
// later call until the index changes: callers must not modify the slice,
// and a page of it costs its size, not a sort. With a fallback, they are
// the keys of either, merged at each call.
func (snap *Snapshot) Keys(ix Index) []string {
	keys := snap.sortedKeys(snap.index(ix))
	fb, _ := snap.conf.companions(ix.id)
	if fb < 0 {
		return keys
	}
	more := snap.sortedKeys(snap.indexAt(fb))
	if len(more) == 0 {
		return keys
	}
	out := make([]string, 0, len(keys)+len(more))
	i, j := 0, 0
	for i < len(keys) || j < len(more) {
		switch {
		case j == len(more) || i < len(keys) && keys[i] < more[j]:
			out = append(out, keys[i])
			i++
		case i == len(keys) || more[j] < keys[i]:
			out = append(out, more[j])
			j++
		default:
			out = append(out, keys[i])
			i, j = i+1, j+1
		}
	}
	return out
}

// sortedKeys returns the keys of one state of an index, sorted once.
func (snap *Snapshot) sortedKeys(is *indexSnap) []string {
	is.sorted.once.Do(func() {
		keys := make([]string, 0, is.keys)
		is.values.all(func(key string, _ []string) { keys = append(keys, key) })
		sort.Strings(keys)
		is.sorted.keys = keys
	})
	return is.sorted.keys
}

// Payload returns the payload of an object of src, if it has one.
func (snap *Snapshot) Payload(src *Source, objectKey string) (any, bool) {
	p, ok := snap.source(src).payload[snap.s.shardOf(objectKey)][objectKey]
	return p, ok
}

// Payloads calls f with the object key and payload of every object of src
// that has a payload, in no particular order.
func (snap *Snapshot) Payloads(src *Source, f func(objectKey string, payload any)) {
	for _, shard := range snap.source(src).payload {
		for k, p := range shard {
			f(k, p)
		}
	}
}

// ObjectCount returns the number of objects of src.
func (snap *Snapshot) ObjectCount(src *Source) int { return snap.source(src).objects }

// Resolve follows a chain of indexes: the values of each step are the keys
// of the next. It returns the distinct values of the last step, sorted, or
// nil. It allocates.
func (snap *Snapshot) Resolve(chain []Index, key string) []string {
	return snap.ResolvePreferring(chain, key)
}

// ResolvePreferring is Resolve with each step's lookup narrowed by prefer
// (see LookupPreferring).
func (snap *Snapshot) ResolvePreferring(chain []Index, key string, prefer ...string) []string {
	keys := []string{key}
	for _, ix := range chain {
		if len(keys) == 1 {
			keys = snap.LookupPreferring(ix, keys[0], prefer...)
			continue
		}
		var next []string
		for _, k := range keys {
			next = append(next, snap.LookupPreferring(ix, k, prefer...)...)
		}
		slices.Sort(next)
		keys = slices.Compact(next)
	}
	if len(keys) == 0 {
		return nil
	}
	return slices.Clip(slices.Clone(keys))
}
