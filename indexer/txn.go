package indexer

import (
	"maps"
	"slices"
	"sort"
	"strings"
)

// Txn is one write transaction on a Source: any number of Put and Delete
// calls, published together by Commit. A Txn holds its source's writer
// lock from Begin to Commit and must always be committed: the writers of
// other sources go on meanwhile, and wait for a commit only while it is
// published.
type Txn struct {
	src      *Source
	work     []map[string]*work // per source index: pending changes by index key
	payloads map[string]any     // object key -> new payload (nil: none)
	count    int                // change in the number of objects
	// touched, of a source that tells parts (SourceSpec.Parts): per
	// source index, the keys (copies) of entries that another object
	// gives too, added or withdrawn: their values stay, their givers not.
	touched []map[string]struct{}
}

// work collects a transaction's pending changes to one index key.
type work struct {
	values, objects []string // as published before the transaction
	addV, remV      map[string]struct{}
	addO, remO      map[string]struct{}
	// Of a unique index: the claims the transaction withdraws and makes,
	// in order.
	claims []claimChange
}

// Begin starts a transaction on the source, waiting for the source's
// other writers (and for a Reconfigure or Compact under way).
func (src *Source) Begin() *Txn {
	src.mu.Lock()
	return src.begin()
}

// begin starts a transaction under src.mu.
func (src *Source) begin() *Txn {
	return &Txn{src: src, work: make([]map[string]*work, len(src.indexes))}
}

// Prepare does, without any lock, the work of Put and Replace that needs
// none: it sorts and de-duplicates the entries (in place) and encodes
// them with the object key into the one string that the source will keep
// of the object, its record (see objectSet); Key is then a part of it.
// Call it where objects are decoded to take that work off the writer's
// path; Put and Replace prepare what was not. A prepared object is the
// one its record names: setting Key afterwards changes nothing.
func (src *Source) Prepare(o *Object) {
	if o.prepared {
		// The record says which object this is, whatever Key was set
		// to since.
		o.Key, o.enc = splitRecord(o.rec)
		return
	}
	entries := o.Entries
	for i := range entries {
		entries[i] = normalize(entries[i])
	}
	for len(entries) < int(src.width.Load()) {
		entries = append(entries, nil)
	}
	var head [24]byte
	o.rec, o.Key, o.enc = newRecord(o.Key, encodeMeta(head[:0], o.Meta), entries)
	o.Meta.Version = ""
	o.prepared = true
	o.Entries = nil
}

// Put sets an object: its entries replace whatever it contributed before,
// and its payload replaces the previous one. Put sorts o.Entries in place.
func (t *Txn) Put(o Object) {
	src := t.src
	if src.removed {
		return // Commit publishes nothing either
	}
	src.Prepare(&o)
	old, had := src.objects.Get(o.Key)
	after := decodeInto(src.scratch(0), o.enc, o.Key)
	var before [][]Entry
	if had {
		before = decodeInto(src.scratch(1), old, o.Key)
	}
	for i := range src.indexes {
		var b []Entry
		if had {
			b = before[i]
		}
		t.diff(i, o.Key, b, after[i])
		if src.unique[i] {
			var was int64
			if had {
				was = createdOf(old)
			}
			t.claimsDiff(i, o.Key, was, createdOf(o.enc), b, after[i])
		}
	}
	if !had {
		t.count++
		src.prefixes.note(o.Key)
	}
	src.objects.Put(o.rec)
	src.dropScratch()
	t.setPayload(o.Key, o.Payload)
}

// Added returns how many objects the transaction adds to the source so
// far: Puts of new keys less Deletes of held ones (negative when it
// removes more than it adds).
func (t *Txn) Added() int { return t.count }

// Delete removes an object and everything it contributed. Deleting an
// unknown object does nothing.
func (t *Txn) Delete(objectKey string) {
	src := t.src
	if src.removed {
		return
	}
	old, had := src.objects.Get(objectKey)
	if !had {
		return
	}
	before := decodeInto(src.scratch(1), old, objectKey)
	for i := range src.indexes {
		t.diff(i, objectKey, before[i], nil)
		if src.unique[i] {
			c := createdOf(old)
			t.claimsDiff(i, objectKey, c, c, before[i], nil)
		}
	}
	t.count--
	src.objects.Delete(objectKey)
	src.dropScratch()
	t.setPayload(objectKey, nil)
}

// scratch returns the room for an object's decoded entries, one per
// index, that Put (k 0: after, 1: before) and Delete (1) reuse from one
// write to the next: nothing they call keeps the slices, and a decode's
// garbage would otherwise be allocated beside the records that stay, and
// scatter them.
func (src *Source) scratch(k int) [][]Entry {
	b := src.decoded[k]
	if len(b) != len(src.indexes) {
		b = make([][]Entry, len(src.indexes))
		src.decoded[k] = b
	}
	return b
}

// dropScratch empties the scratch's entries, whose strings are parts of
// records (an old one would stay alive through them), and lets the room
// of a large object's go.
func (src *Source) dropScratch() {
	for _, b := range src.decoded {
		for i, es := range b {
			if cap(es) > 64 {
				b[i] = nil
			} else {
				clear(es)
			}
		}
	}
}

// setPayload records a payload change; nil removes the payload.
func (t *Txn) setPayload(objectKey string, p any) {
	if p != nil {
		t.src.payloads = true
	}
	if !t.src.payloads {
		return
	}
	if t.payloads == nil {
		t.payloads = map[string]any{}
	}
	if p != nil {
		// A published key is a copy: objectKey is a part of a record.
		objectKey = strings.Clone(objectKey)
	}
	t.payloads[objectKey] = p
}

// diff applies the change from one sorted, distinct entry list of an object
// to another.
func (t *Txn) diff(i int, object string, before, after []Entry) {
	a, b := 0, 0
	for a < len(before) || b < len(after) {
		switch {
		case b == len(after) || (a < len(before) && compareEntry(before[a], after[b]) < 0):
			t.removeValue(i, before[a])
			a++
		case a == len(before) || compareEntry(before[a], after[b]) > 0:
			t.addValue(i, after[b])
			b++
		default:
			a++
			b++
		}
	}
	if !t.src.withObjects {
		return
	}
	// The object is listed under the distinct keys of its entries.
	oldKeys, newKeys := distinctKeys(before), distinctKeys(after)
	a, b = 0, 0
	for a < len(oldKeys) || b < len(newKeys) {
		switch {
		case b == len(newKeys) || (a < len(oldKeys) && oldKeys[a] < newKeys[b]):
			w := t.workFor(i, oldKeys[a])
			toggle(&w.remO, &w.addO, object)
			a++
		case a == len(oldKeys) || oldKeys[a] > newKeys[b]:
			w := t.workFor(i, newKeys[b])
			toggle(&w.addO, &w.remO, object)
			b++
		default:
			a++
			b++
		}
	}
}

func distinctKeys(es []Entry) []string {
	var keys []string
	for _, e := range es {
		if len(keys) == 0 || keys[len(keys)-1] != e.Key {
			keys = append(keys, e.Key)
		}
	}
	return keys
}

// toggle records s in set, unless the opposite set holds it, in which case
// the two cancel out.
func toggle(set, opposite *map[string]struct{}, s string) {
	if _, ok := (*opposite)[s]; ok {
		delete(*opposite, s)
		return
	}
	if *set == nil {
		*set = map[string]struct{}{}
	}
	(*set)[s] = struct{}{}
}

func (t *Txn) workFor(i int, key string) *work {
	m := t.work[i]
	if m == nil {
		m = map[string]*work{}
		t.work[i] = m
	}
	w := m[key]
	if w == nil {
		// This index's own values, never its fallback's (Lookup's), as
		// this source last published them: only its writers change them.
		is := t.src.s.current.Load().indexAt(t.src.indexes[i])
		w = &work{values: is.values.lookup(t.src.s.seed, key)}
		if c, ok := is.chosen.get(t.src.s.seed, key); ok {
			w.values = c.raw // the table holds the chosen values
		}
		if is.objects != nil {
			w.objects = is.objects.lookup(t.src.s.seed, key)
		}
		// The work's key is a copy: key is a part of a record, and what
		// the commit derives from the work (claims, chosen answers, the
		// keys the commit hook hears of) may outlive the record.
		m[strings.Clone(key)] = w
	}
	return w
}

// has reports whether value is present under the key, pending changes
// included.
func (w *work) has(value string) bool {
	if _, ok := w.addV[value]; ok {
		return true
	}
	if _, ok := w.remV[value]; ok {
		return false
	}
	_, found := slices.BinarySearch(w.values, value)
	return found
}

func (t *Txn) addValue(i int, e Entry) {
	w := t.workFor(i, e.Key)
	if w.has(e.Value) {
		// The count is behind a pointer so that it changes without
		// storing e again: a map assignment would replace the stored key
		// with e, whose strings belong to an encoding.
		t.touch(i, e.Key)
		dups := t.src.dups[i]
		if d := dups[e]; d != nil {
			*d++
		} else {
			one := int32(1)
			dups[Entry{Key: strings.Clone(e.Key), Value: strings.Clone(e.Value)}] = &one
			if len(dups) > t.src.dupsPeak[i] {
				t.src.dupsPeak[i] = len(dups)
			}
		}
		return
	}
	if _, back := w.remV[e.Value]; back {
		// Withdrawn and given again in one transaction: the value stays,
		// maybe from another object.
		t.touch(i, e.Key)
	}
	toggle(&w.addV, &w.remV, e.Value)
}

func (t *Txn) removeValue(i int, e Entry) {
	dups := t.src.dups[i]
	if d := dups[e]; d != nil {
		t.touch(i, e.Key)
		if *d == 1 {
			delete(dups, e)
			t.src.dups[i] = shrunk(dups, &t.src.dupsPeak[i])
		} else {
			*d--
		}
		return
	}
	w := t.workFor(i, e.Key)
	if _, back := w.addV[e.Value]; back {
		t.touch(i, e.Key) // given and withdrawn in one transaction
	}
	toggle(&w.remV, &w.addV, e.Value)
}

// touch notes, of a source that tells parts, that key's givers changed.
func (t *Txn) touch(i int, key string) {
	if !t.src.tellParts || t.src.s.commitHook() == nil {
		return
	}
	if t.touched == nil {
		t.touched = make([]map[string]struct{}, len(t.src.indexes))
	}
	m := t.touched[i]
	if m == nil {
		m = map[string]struct{}{}
		t.touched[i] = m
	}
	if _, ok := m[key]; !ok {
		m[strings.Clone(key)] = struct{}{} // key is a part of a record
	}
}

// interner copies the strings that one write publishes, each distinct
// string once: published keys and values never share memory with an
// object's encoding (see Source.objects).
type interner map[string]string

func (in *interner) clone(s string) string {
	if c, ok := (*in)[s]; ok {
		return c
	}
	if *in == nil {
		*in = interner{}
	}
	c := strings.Clone(s)
	(*in)[c] = c
	return c
}

// apply returns base with rem removed and add added, sorted: a merge of
// the sorted base with the few sorted additions, which are copied through
// in. It returns base itself when nothing changes. The result has no
// spare capacity: a caller that appends to it gets an array of its own.
func apply(base []string, add, rem map[string]struct{}, in *interner) []string {
	if len(add) == 0 && len(rem) == 0 {
		return base
	}
	adds := make([]string, 0, len(add))
	for v := range add {
		adds = append(adds, in.clone(v))
	}
	sort.Strings(adds)
	n := len(base) + len(adds)
	for v := range rem {
		if _, ok := slices.BinarySearch(base, v); ok {
			n--
		}
	}
	out := make([]string, 0, n)
	j := 0
	for _, v := range base {
		if _, gone := rem[v]; gone {
			continue
		}
		for j < len(adds) && adds[j] < v {
			out = append(out, adds[j])
			j++
		}
		out = append(out, v)
	}
	out = append(out, adds[j:]...)
	if len(out) == 0 {
		return nil
	}
	return slices.Clip(out)
}

// Commit publishes the transaction and releases the source's writer lock.
func (t *Txn) Commit() {
	src := t.src
	s := src.s
	defer src.mu.Unlock()
	if src.removed {
		return
	}
	// The source's part of the current snapshot is its own: it changes
	// only under src.mu, which this transaction holds.
	old := s.current.Load()
	var states []*indexSnap
	var in interner
	var changes []Change
	for i, m := range t.work {
		touched := i < len(t.touched) && len(t.touched[i]) > 0
		if len(m) == 0 && !touched {
			continue
		}
		id := src.indexes[i]
		var keys []string
		if len(m) > 0 {
			if states == nil {
				states = make([]*indexSnap, len(src.indexes))
			}
			states[i], keys = t.commitIndex(i, m, old.indexes[id], &in)
		}
		if touched {
			keys = t.withTouched(i, keys)
		}
		if len(keys) > 0 {
			changes = append(changes, Change{Index: s.handle(id), Keys: keys})
		}
	}
	var ss *sourceSnap
	if len(t.payloads) > 0 || t.count != 0 {
		ss = t.commitPayloads(old.sources[src.id])
	}
	s.publishSource(src, states, ss, changes)
	src.tellConflicts()
}

// withTouched returns keys with the keys of index i whose givers changed
// (see touch) that it lacks.
func (t *Txn) withTouched(i int, keys []string) []string {
	if len(t.touched[i]) == 0 {
		return keys
	}
	had := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		had[k] = struct{}{}
	}
	for k := range t.touched[i] {
		if _, ok := had[k]; !ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// commitIndex is the table of index i after the work m on was, and the
// keys whose answer changed (when a commit hook wants them).
func (t *Txn) commitIndex(i int, m map[string]*work, was *indexSnap, in *interner) (*indexSnap, []string) {
	s := t.src.s
	is := *was
	is.sorted = &sortedKeys{}
	values := make([]change, 0, len(m))
	var objects []change
	var keys []string
	unique := t.src.unique[i]
	hooked := s.commitHook() != nil
	var raw map[string][]string    // of a unique index: each key's values after
	var owners map[string][]string // of a unique index with objects: each key's objects after
	if unique {
		raw = make(map[string][]string, len(m))
		if is.objects != nil {
			owners = make(map[string][]string, len(m))
		}
	}
	for key, w := range m {
		h := s.hash(key)
		if len(w.addV) > 0 || len(w.remV) > 0 {
			vs := apply(w.values, w.addV, w.remV, in)
			if unique {
				raw[key] = vs
			} else {
				values = append(values, change{hash: h, key: key, values: vs})
				if hooked {
					keys = append(keys, key)
				}
			}
		} else if unique {
			raw[key] = w.values
		}
		if is.objects != nil && (len(w.addO) > 0 || len(w.remO) > 0) {
			os := apply(w.objects, w.addO, w.remO, in)
			objects = append(objects, change{hash: h, key: key, values: os})
			if owners != nil {
				owners[key] = os
			}
		} else if owners != nil {
			owners[key] = w.objects
		}
	}
	if unique {
		// The table holds what a key answers: its values, or the chosen
		// ones of a key in conflict. A key whose values changed but whose
		// answer did not (a younger claimant came) is no change.
		var objectsOf func(key string) []string
		if owners != nil {
			objectsOf = func(key string) []string { return owners[key] }
		}
		is.chosen = t.src.settle(i, m, func(key string) []string { return raw[key] }, objectsOf, was.chosen)
		for key := range m {
			answer := raw[key]
			if c, ok := is.chosen.get(s.seed, key); ok {
				answer = c.values
			}
			if !slices.Equal(answer, was.values.lookup(s.seed, key)) {
				values = append(values, change{hash: s.hash(key), key: key, values: answer})
				if hooked {
					keys = append(keys, key)
				}
			}
		}
	}
	var delta int
	is.values, delta = is.values.update(s.seed, values)
	is.keys += delta
	if len(objects) > 0 {
		o, _ := is.objects.update(s.seed, objects)
		is.objects = &o
	}
	// Spread the index over more pages when it has outgrown its pages
	// fourfold, and over fewer when it has shrunk as much: a key count
	// going up and down by less than that never rehashes, and a rehash,
	// which costs the index, follows as many writes.
	if bits := bitsFor(is.keys); bits > is.values.bits+1 || bits+1 < is.values.bits {
		is.values = is.values.rehash(bits, s.hash)
		if is.objects != nil {
			o := is.objects.rehash(bits, s.hash)
			is.objects = &o
		}
	}
	return &is, keys
}

// commitPayloads is the source's table after the transaction's payloads
// and object count, from was: only the shards it writes are copied.
func (t *Txn) commitPayloads(was *sourceSnap) *sourceSnap {
	ss := *was
	ss.objects += t.count
	var cloned [payloadShards]bool
	for key, p := range t.payloads {
		sh := t.src.s.shardOf(key)
		if !cloned[sh] {
			ss.payload[sh] = maps.Clone(ss.payload[sh])
			if ss.payload[sh] == nil {
				ss.payload[sh] = map[string]any{}
			}
			cloned[sh] = true
		}
		if p == nil {
			delete(ss.payload[sh], key)
		} else {
			ss.payload[sh][key] = p
		}
	}
	// A clone keeps the room of the shard's deleted payloads: give it back
	// when a shard has shrunk a lot (see shrunk), and drop a shard left
	// empty (a nil shard reads as empty, as after rebuild).
	for sh, c := range cloned {
		if !c {
			continue
		}
		if len(ss.payload[sh]) == 0 {
			ss.payload[sh], t.src.payloadPeak[sh] = nil, 0
			continue
		}
		ss.payload[sh] = shrunk(ss.payload[sh], &t.src.payloadPeak[sh])
	}
	return &ss
}
