package indexer

import (
	"cmp"
	"slices"
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
func (src *Source) Replace(objs []Object) { src.ReplaceWithin("", objs) }

// ReplaceWithin is Replace for the objects whose keys begin with prefix:
// those that objs lacks are removed, the others are left alone. Every
// object of objs must have a key that begins with prefix. Several
// writers of one source (one per part of its objects: a cluster's, say)
// each replace their own part.
func (src *Source) ReplaceWithin(prefix string, objs []Object) {
	// Under the source's lock only: its build or its diff, however long,
	// delays no other source's writers; the store is locked only to
	// publish the result.
	src.mu.Lock()
	if src.objects.Len() == 0 {
		defer src.mu.Unlock()
		src.rebuildLocked(objs)
		return
	}
	for i := range objs {
		src.Prepare(&objs[i])
	}
	tx := src.begin()
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
		if _, ok := seen[key]; !ok && strings.HasPrefix(key, prefix) {
			gone = append(gone, key)
		}
	}
	for _, key := range gone {
		tx.Delete(key)
	}
	if writeHook != nil {
		writeHook(src)
	}
	tx.Commit()
}

// writeHook, when set (by tests), is called by a Replace in the middle of
// its work, under the source's lock: before the publication of a build
// or of a diff.
var writeHook func(src *Source)

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

// rebuildLocked builds the source's indexes from objs from scratch, under
// src.mu: the build reads and writes the source's state only, from what
// the source last published, and the store's publication lock is taken
// only to publish the result.
func (src *Source) rebuildLocked(objs []Object) {
	s := src.s
	if src.removed {
		return
	}

	objects := newObjectSet(s.seed, len(objs))
	payloads := map[string]any{}
	src.prefixes.reset()
	for i := range objs {
		o := &objs[i]
		src.Prepare(o)
		key := o.Key
		src.prefixes.note(key)
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

	old := s.current.Load() // the source's part is its own (see Commit)
	states := make([]*indexSnap, len(src.indexes))
	var published []Change
	counts := countEntries(objects, len(src.indexes))
	for i, id := range src.indexes {
		is, keys := src.buildIndex(i, objects, counts[i], old.indexes[id])
		if src.unique[i] {
			src.objects = objects // what chooseAll reads
			src.chooseAll(i, is)
		}
		states[i] = is
		if keys != nil {
			published = append(published, Change{Index: s.handle(id), Keys: keys})
		}
	}
	ss := src.buildPayloads(objects.Len(), payloads)
	src.objects = objects
	if writeHook != nil {
		writeHook(src)
	}
	s.publishSource(src, states, ss, published)
	src.tellConflicts()
}

// flat is one entry of an index in a bulk build: the hash of its key, the
// key, its value, and the record of the object that gives it. Sorted by
// hash, key and value, the entries of a key lie together, its values in
// order, and the keys of a page of the table in a row (a page is the
// hash's top bits).
type flat struct {
	hash       uint64
	key, value string
	rec        *byte // see objectSet
}

func compareFlat(a, b flat) int {
	if a.hash != b.hash {
		return cmp.Compare(a.hash, b.hash)
	}
	if c := strings.Compare(a.key, b.key); c != 0 {
		return c
	}
	return strings.Compare(a.value, b.value)
}

// countEntries counts the entries of every object per index (of n).
func countEntries(objects *objectSet, n int) []int {
	counts := make([]int, n)
	for _, enc := range objects.All() {
		_, enc = splitMeta(enc)
		for i := range n {
			var c int
			c, enc = skipEntries(enc)
			counts[i] += c
		}
	}
	return counts
}

// gather appends the entries of index i of every object to fs, and sorts
// them (compareFlat). The keys that decoding rebuilds (front-coded ones)
// lie in rooms of their own, which the caller copies out of.
func (src *Source) gather(i int, objects *objectSet, fs []flat) []flat {
	var es []Entry
	var keys []byte
	for p := range objects.Records() {
		objKey, enc := splitRecord(recordAt(p))
		_, enc = splitMeta(enc)
		for range i {
			_, enc = skipEntries(enc) // the indexes before i
		}
		es, _ = decodeEntries(es, enc, objKey, objectName(objKey), &keys)
		for _, e := range es {
			fs = append(fs, flat{hash: src.s.hash(e.Key), key: e.Key, value: e.Value, rec: p})
		}
	}
	slices.SortFunc(fs, compareFlat)
	return fs
}

// buildIndex builds the table of the source's index i from the objects
// (entries of it in all), and resets its duplicate counts. It returns the
// keys whose answer changed from was (when a commit hook wants them):
// every key it holds, and every key of was that it lacks.
//
// What it holds besides the table, at most: the entries as flats (48
// bytes each; gone before the table is laid out) and as changes (48 bytes
// a key, twice with the objects table), and a map of the distinct values.
func (src *Source) buildIndex(i int, objects *objectSet, entries int, was *indexSnap) (*indexSnap, []string) {
	s := src.s
	fs := src.gather(i, objects, make([]flat, 0, entries))
	distinct := 0
	for j := range fs {
		if j == 0 || fs[j].hash != fs[j-1].hash || fs[j].key != fs[j-1].key {
			distinct++
		}
	}
	dups := map[Entry]*int32{}
	// Keys and values are copied out of the encodings (see
	// Source.objects), each distinct value once: single maps each to a
	// one-value slice of its copy, which every key whose only value it is
	// shares. One map serves both, for one lookup per value.
	single := make(map[string][]string, objects.Len())
	intern := func(v string) []string {
		one, ok := single[v]
		if !ok {
			c := strings.Clone(v)
			one = []string{c}
			single[c] = one
		}
		return one
	}
	changes := make([]change, 0, distinct)
	var objChanges []change // the objects table's: the same keys
	var owners map[string]string
	var objKeys []string
	if src.withObjects {
		objChanges = make([]change, 0, distinct)
		owners = make(map[string]string, objects.Len()) // an object key's one copy
	}
	for j := 0; j < len(fs); {
		first := fs[j]
		k := strings.Clone(first.key)
		n, end := 0, j // distinct values; the end of the key's run
		for ; end < len(fs) && fs[end].hash == first.hash && fs[end].key == first.key; end++ {
			if end > j && fs[end].value == fs[end-1].value {
				e := Entry{Key: k, Value: fs[end].value}
				if d := dups[e]; d != nil {
					*d++
				} else {
					one := int32(1)
					dups[Entry{Key: k, Value: intern(e.Value)[0]}] = &one
				}
				continue
			}
			n++
		}
		var values []string
		if n == 1 {
			values = intern(first.value)
		} else {
			values = make([]string, 0, n)
			for x := j; x < end; x++ {
				if x == j || fs[x].value != fs[x-1].value {
					values = append(values, intern(fs[x].value)[0])
				}
			}
		}
		changes = append(changes, change{hash: first.hash, key: k, values: values})
		if src.withObjects {
			objKeys = objKeys[:0]
			for x := j; x < end; x++ {
				objKey, _ := splitRecord(recordAt(fs[x].rec))
				objKeys = append(objKeys, objKey)
			}
			slices.Sort(objKeys)
			objKeys = slices.Compact(objKeys)
			os := make([]string, len(objKeys))
			for x, objKey := range objKeys {
				c, ok := owners[objKey]
				if !ok {
					c = strings.Clone(objKey)
					owners[c] = c
				}
				os[x] = c
			}
			objChanges = append(objChanges, change{hash: first.hash, key: k, values: os})
		}
		j = end
	}
	var keys []string
	hooked := s.commitHook() != nil
	if hooked && len(changes) > 0 {
		keys = make([]string, len(changes))
		for j := range changes {
			keys[j] = changes[j].key
		}
	}
	bits := bitsFor(len(changes))
	is := &indexSnap{keys: len(changes), values: build(bits, changes), sorted: &sortedKeys{}}
	if hooked && was.keys > 0 {
		// The source was empty, but its index was not (Load's tables):
		// the keys this rebuild drops are changes too.
		was.values.all(func(key string, _ []string) {
			if is.values.lookup(s.seed, key) == nil {
				keys = append(keys, key)
			}
		})
	}
	if src.withObjects {
		o := build(bits, objChanges)
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
