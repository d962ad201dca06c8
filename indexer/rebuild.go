package indexer

import (
	"slices"
	"sort"
	"strings"
)

// A source's objects set in bulk: Replace (a relist) and the rebuild of
// an empty source.

// Replace sets the source's objects to exactly objs: objects that objs lacks
// are removed, as after a relist; the result equals that of putting objs
// into an empty source. When objs holds an object key twice, the last one
// wins. Replace prepares each object (see Prepare).
//
// An empty source is built in bulk. Otherwise Replace applies, as one
// transaction, only what differs: the objects whose entries or payload
// changed, and the deletes. The pages that no change touches are shared
// with the previous snapshot, so a relist holds little more than one copy
// of the index, however large.
func (src *Source) Replace(objs []Object) {
	src.s.mu.Lock()
	empty := src.objects.Len() == 0
	src.s.mu.Unlock()
	if empty {
		src.rebuild(objs)
		return
	}
	for i := range objs {
		src.Prepare(&objs[i])
	}
	tx := src.Begin()
	snap := src.s.current.Load()
	seen := make(map[string]struct{}, len(objs))
	for i := range objs {
		o := &objs[i]
		seen[o.Key] = struct{}{}
		if old, ok := src.objects.Get(o.Key); ok && old == o.enc && samePayload(snap, src, o) {
			continue
		}
		tx.Put(*o)
	}
	var gone []string
	for key := range src.objects.All() {
		if _, ok := seen[key]; !ok {
			gone = append(gone, key)
		}
	}
	for _, key := range gone {
		tx.Delete(key)
	}
	tx.Commit()
}

// samePayload reports whether o's payload is the one published for it.
// Payloads that cannot be compared count as changed.
func samePayload(snap *Snapshot, src *Source, o *Object) bool {
	old, had := snap.Payload(src, o.Key)
	if !had || o.Payload == nil {
		return !had && o.Payload == nil
	}
	a, ok1 := old.(string)
	b, ok2 := o.Payload.(string)
	return ok1 && ok2 && a == b
}

// rebuild builds the source's indexes from objs from scratch.
func (src *Source) rebuild(objs []Object) {
	src.s.mu.Lock()
	defer src.s.mu.Unlock()
	src.rebuildLocked(objs)
}

// rebuildLocked is rebuild under the writer lock.
func (src *Source) rebuildLocked(objs []Object) {
	s := src.s
	if src.removed {
		return
	}

	objects := newObjectSet(s.seed, len(objs))
	payloads := map[string]any{}
	for i := range objs {
		o := &objs[i]
		src.Prepare(o)
		key := o.Key
		// A copy, made here in a row: the records were made as the
		// objects were decoded, among the decoder's garbage, and would
		// stay scattered over the spans it leaves (resident memory
		// that holds little).
		objects.Put(strings.Clone(o.rec))
		if o.Payload != nil {
			payloads[strings.Clone(key)] = o.Payload
			src.payloads = true
		} else {
			delete(payloads, key)
		}
	}

	old := s.current.Load()
	next := old.derive()
	next.indexes, next.sources = slices.Clone(old.indexes), slices.Clone(old.sources)
	var published []Change
	all, counts := decodeAll(objects, len(src.indexes))
	for i, id := range src.indexes {
		is, keys := src.buildIndex(i, all, counts[i], old.indexes[id])
		if src.unique[i] {
			src.objects = objects // what chooseAll reads
			src.chooseAll(i, is)
		}
		next.indexes[id] = is
		if keys != nil {
			published = append(published, Change{Index: s.handle(id), Keys: keys})
		}
	}
	next.sources[src.id] = src.buildPayloads(objects.Len(), payloads)
	src.objects = objects
	s.publish(next, published)
	src.tellConflicts()
}

// decoded is one object's entries, per index of its source.
type decoded struct {
	key     string
	entries [][]Entry
}

// decodeAll decodes every object once, and counts the entries per index
// (of n) to size the maps of buildIndex.
func decodeAll(objects *objectSet, n int) ([]decoded, []int) {
	all := make([]decoded, 0, objects.Len())
	counts := make([]int, n)
	var keys []byte // the keys decode rebuilds, for every object
	for objKey, enc := range objects.All() {
		es := decodeIn(make([][]Entry, n), enc, objKey, &keys)
		for i := range es {
			counts[i] += len(es[i])
		}
		all = append(all, decoded{objKey, es})
	}
	return all, counts
}

// buildIndex builds the table of the source's index i from all (entries
// of it in all: about entries), and resets its duplicate counts. It
// returns the keys whose answer changed from was (when a commit hook
// wants them): every key it holds, and every key of was that it lacks.
func (src *Source) buildIndex(i int, all []decoded, entries int, was *indexSnap) (*indexSnap, []string) {
	s := src.s
	values := make(map[string][]string, entries)
	var objectsOf map[string][]string
	if src.withObjects {
		objectsOf = make(map[string][]string, entries)
	}
	for _, d := range all {
		es := d.entries[i]
		owner := "" // the object key's copy, made once (see Source.objects)
		for j, e := range es {
			values[e.Key] = append(values[e.Key], e.Value)
			if objectsOf != nil && (j == 0 || es[j-1].Key != e.Key) {
				if owner == "" {
					owner = strings.Clone(d.key)
				}
				objectsOf[e.Key] = append(objectsOf[e.Key], owner)
			}
		}
	}
	dups := map[Entry]*int32{}
	bits := bitsFor(len(values))
	// Keys and values are copied out of the encodings (see
	// Source.objects), each distinct value once: single maps each to a
	// one-value slice of its copy, which every key whose only value it is
	// shares. One map serves both, for one lookup per value.
	single := make(map[string][]string, len(all))
	intern := func(v string) []string {
		one, ok := single[v]
		if !ok {
			c := strings.Clone(v)
			one = []string{c}
			single[c] = one
		}
		return one
	}
	changes := make([]change, 0, len(values))
	// owned maps each key to its copy, for the objects table only.
	var owned map[string]string
	if objectsOf != nil {
		owned = make(map[string]string, len(values))
	}
	for key, vs := range values {
		sort.Strings(vs)
		distinct := vs[:0]
		for _, v := range vs {
			if len(distinct) > 0 && distinct[len(distinct)-1] == v {
				e := Entry{Key: key, Value: v}
				if d := dups[e]; d != nil {
					*d++
				} else {
					one := int32(1)
					dups[Entry{Key: intern(key)[0], Value: intern(v)[0]}] = &one
				}
				continue
			}
			distinct = append(distinct, v)
		}
		if len(distinct) == 1 {
			distinct = intern(distinct[0])
		} else {
			for j, v := range distinct {
				distinct[j] = intern(v)[0]
			}
			distinct = slices.Clip(slices.Clone(distinct))
		}
		k := strings.Clone(key)
		if owned != nil {
			owned[key] = k
		}
		changes = append(changes, change{hash: s.hash(k), key: k, values: distinct})
	}
	var keys []string
	if s.onCommit != nil && len(changes) > 0 {
		keys = make([]string, len(changes))
		for j := range changes {
			keys[j] = changes[j].key
		}
	}
	if s.onCommit != nil && was.keys > 0 {
		// The source was empty, but its index was not (Load's tables):
		// the keys this rebuild drops are changes too.
		was.values.all(func(key string, _ []string) {
			if _, ok := values[key]; !ok {
				keys = append(keys, key)
			}
		})
	}
	is := &indexSnap{keys: len(values), values: build(bits, changes), sorted: &sortedKeys{}}
	if objectsOf != nil {
		changes = changes[:0]
		for key, os := range objectsOf {
			sort.Strings(os)
			changes = append(changes, change{hash: s.hash(key), key: owned[key], values: slices.Clip(os)})
		}
		o := build(bits, changes)
		is.objects = &o
	}
	src.dups[i] = dups
	src.dupsPeak[i] = len(dups)
	return is, keys
}

// buildPayloads is the source's table of count objects with payloads.
func (src *Source) buildPayloads(count int, payloads map[string]any) *sourceSnap {
	ss := &sourceSnap{objects: count}
	for key, p := range payloads {
		sh := src.s.shardOf(key)
		if ss.payload[sh] == nil {
			ss.payload[sh] = map[string]any{}
		}
		ss.payload[sh][key] = p
	}
	for sh := range ss.payload {
		src.payloadPeak[sh] = len(ss.payload[sh])
	}
	return ss
}
