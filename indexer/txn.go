package indexer

import (
	"encoding/binary"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Txn is one write transaction on a Source: any number of Put and Delete
// calls, published together by Commit. A Txn holds the Store's writer lock
// from Begin to Commit and must always be committed.
type Txn struct {
	src      *Source
	work     []map[string]*work // per source index: pending changes by index key
	payloads map[string]any     // object key -> new payload (nil: none)
	count    int                // change in the number of objects
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

// Begin starts a transaction on the source, waiting for other writers.
func (src *Source) Begin() *Txn {
	src.s.mu.Lock()
	return &Txn{src: src, work: make([]map[string]*work, len(src.indexes))}
}

// Marks of encode for a value that is not written out.
const (
	sameAsObjectKey = 0 // the value is the object key
	sameAsPrevious  = 1 // the value is the previous entry's value
	valueOffset     = 2 // otherwise: length + valueOffset, then the bytes
)

// encode packs an object's normalized entries into one string: its
// provenance (see encodeMeta), then per index the number of entries, then
// each key and value with its length. A value equal to the object key, or
// to the previous value, is stored as a mark, not a copy.
func encode(objectKey string, meta Meta, entries [][]Entry) string {
	return encodeAfter(encodeMeta(nil, meta), objectKey, entries)
}

// encodeAfter is encode with the provenance already encoded (head).
func encodeAfter(head []byte, objectKey string, entries [][]Entry) string {
	size := len(head)
	for _, es := range entries {
		size++
		for _, e := range es {
			size += 2 + len(e.Key) + 2 + len(e.Value)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, head...)
	for _, es := range entries {
		b = binary.AppendUvarint(b, uint64(len(es)))
		prev := ""
		for j, e := range es {
			b = binary.AppendUvarint(b, uint64(len(e.Key)))
			b = append(b, e.Key...)
			switch {
			case e.Value == objectKey:
				b = append(b, sameAsObjectKey)
			case j > 0 && e.Value == prev:
				b = append(b, sameAsPrevious)
			default:
				b = binary.AppendUvarint(b, uint64(len(e.Value))+valueOffset)
				b = append(b, e.Value...)
			}
			prev = e.Value
		}
	}
	return string(b)
}

// encodeMeta appends an object's provenance to b: the creation time in
// seconds (0: unknown), then the version, as a number when it is one
// (uvarint(n<<1|1), a few bytes for a resourceVersion) and otherwise as
// its bytes (uvarint(len<<1), then the bytes).
func encodeMeta(b []byte, m Meta) []byte {
	created := uint64(0)
	if m.Created > 0 {
		created = uint64(m.Created)
	}
	b = binary.AppendUvarint(b, created)
	if n, ok := versionNumber(m.Version); ok {
		return binary.AppendUvarint(b, n<<1|1)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Version))<<1)
	return append(b, m.Version...)
}

// versionNumber reads a version that is a decimal number without leading
// zeros, below 2^62.
func versionNumber(v string) (uint64, bool) {
	if v == "" || len(v) > 18 || v[0] == '0' {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// uvarint reads one uvarint at the start of enc.
func uvarint(enc string) (uint64, string) {
	var v uint64
	for shift := 0; ; shift += 7 {
		c := enc[0]
		enc = enc[1:]
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, enc
		}
	}
}

// splitMeta splits an encoding into its provenance and its entries.
func splitMeta(enc string) (head, rest string) {
	_, rest = uvarint(enc)
	n, rest := uvarint(rest)
	if n&1 == 0 {
		rest = rest[n>>1:]
	}
	return enc[:len(enc)-len(rest)], rest
}

// decodeMeta reads the provenance of an encoding. A numeric version is
// formatted anew: a caller that keeps it owns it.
func decodeMeta(enc string) Meta {
	created, rest := uvarint(enc)
	n, rest := uvarint(rest)
	m := Meta{Created: int64(created)}
	if n&1 == 1 {
		m.Version = strconv.FormatUint(n>>1, 10)
	} else {
		m.Version = strings.Clone(rest[:n>>1])
	}
	return m
}

// decode unpacks what encode packed, for n indexes. The strings it returns
// are substrings of enc (or objectKey).
func decode(enc, objectKey string, n int) [][]Entry {
	return decodeInto(make([][]Entry, n), enc, objectKey)
}

// decodeInto is decode into out (len(out) indexes), reusing the room of
// out's slices: what it returns is valid until the next call with out.
func decodeInto(out [][]Entry, enc, objectKey string) [][]Entry {
	n := len(out)
	_, enc = splitMeta(enc)
	next := func() int {
		v, rest := uvarint(enc)
		enc = rest
		return int(v)
	}
	for i := range n {
		if enc == "" {
			out[i] = out[i][:0] // none
			continue
		}
		count := next()
		es := out[i][:0]
		if es == nil || cap(es) < count {
			es = make([]Entry, count)
		}
		es = es[:count]
		for j := range count {
			l := next()
			es[j].Key, enc = enc[:l], enc[l:]
			switch l := next(); l {
			case sameAsObjectKey:
				es[j].Value = objectKey
			case sameAsPrevious:
				es[j].Value = es[j-1].Value
			default:
				es[j].Value, enc = enc[:l-valueOffset], enc[l-valueOffset:]
			}
		}
		out[i] = es
	}
	return out
}

// Prepare does, without any lock, the work of Put and Replace that needs
// none: it copies the object key, sorts and de-duplicates the entries
// (in place) and encodes them into the one string that the index will keep
// (every key and value the index holds is a substring of it). Call it where
// objects are decoded to take that work off the writer's path; Put and
// Replace prepare what was not.
func (src *Source) Prepare(o *Object) {
	if o.prepared {
		return
	}
	o.Key = strings.Clone(o.Key)
	entries := o.Entries
	for i := range entries {
		entries[i] = normalize(entries[i])
	}
	for len(entries) < int(src.width.Load()) {
		entries = append(entries, nil)
	}
	o.enc = encode(o.Key, o.Meta, entries)
	o.Meta.Version = ""
	o.prepared = true
	o.Entries = nil
}

// Put sets an object: its entries replace whatever it contributed before,
// and its payload replaces the previous one. Put sorts o.Entries in place.
func (t *Txn) Put(o Object) {
	src := t.src
	src.Prepare(&o)
	old, had := src.objects[o.Key]
	after := decode(o.enc, o.Key, len(src.indexes))
	var before [][]Entry
	if had {
		before = decode(old, o.Key, len(src.indexes))
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
	}
	src.objects[o.Key] = o.enc
	if !had && len(src.objects) > src.objectsPeak {
		src.objectsPeak = len(src.objects)
	}
	t.setPayload(o.Key, o.Payload)
}

// Delete removes an object and everything it contributed. Deleting an
// unknown object does nothing.
func (t *Txn) Delete(objectKey string) {
	src := t.src
	old, had := src.objects[objectKey]
	if !had {
		return
	}
	before := decode(old, objectKey, len(src.indexes))
	for i := range src.indexes {
		t.diff(i, objectKey, before[i], nil)
		if src.unique[i] {
			c := createdOf(old)
			t.claimsDiff(i, objectKey, c, c, before[i], nil)
		}
	}
	t.count--
	delete(src.objects, objectKey)
	src.objects = shrunk(src.objects, &src.objectsPeak)
	t.setPayload(objectKey, nil)
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
		// This index's own values, never its fallback's (Lookup's).
		is := t.src.s.current.Load().indexAt(t.src.indexes[i])
		w = &work{values: is.values.lookup(t.src.s.seed, key)}
		if c, ok := is.chosen[key]; ok {
			w.values = c.raw // the table holds the chosen values
		}
		if is.objects != nil {
			w.objects = is.objects.lookup(t.src.s.seed, key)
		}
		m[key] = w
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
	toggle(&w.addV, &w.remV, e.Value)
}

func (t *Txn) removeValue(i int, e Entry) {
	dups := t.src.dups[i]
	if d := dups[e]; d != nil {
		if *d == 1 {
			delete(dups, e)
			t.src.dups[i] = shrunk(dups, &t.src.dupsPeak[i])
		} else {
			*d--
		}
		return
	}
	w := t.workFor(i, e.Key)
	toggle(&w.remV, &w.addV, e.Value)
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

// Commit publishes the transaction and releases the writer lock.
func (t *Txn) Commit() {
	s := t.src.s
	defer s.mu.Unlock()
	if t.src.removed {
		return
	}
	old := s.current.Load()
	next := old.derive()
	changed := false
	var in interner
	var changes []Change
	for i, m := range t.work {
		if len(m) == 0 {
			continue
		}
		if !changed {
			next.indexes = slices.Clone(old.indexes)
			changed = true
		}
		id := t.src.indexes[i]
		is := *old.indexes[id]
		is.sorted = &sortedKeys{}
		values := make([]change, 0, len(m))
		var objects []change
		var keys []string
		unique := t.src.unique[i]
		var raw map[string][]string // of a unique index: each key's values after
		if unique {
			raw = make(map[string][]string, len(m))
		}
		for key, w := range m {
			h := s.hash(key)
			if len(w.addV) > 0 || len(w.remV) > 0 {
				vs := apply(w.values, w.addV, w.remV, &in)
				if unique {
					raw[key] = vs
				} else {
					values = append(values, change{hash: h, key: key, values: vs})
					if s.onCommit != nil {
						keys = append(keys, key)
					}
				}
			} else if unique {
				raw[key] = w.values
			}
			if is.objects != nil && (len(w.addO) > 0 || len(w.remO) > 0) {
				objects = append(objects, change{hash: h, key: key, values: apply(w.objects, w.addO, w.remO, &in)})
			}
		}
		if unique {
			// The table holds what a key answers: its values, or the
			// chosen ones of a key in conflict. A key whose values
			// changed but whose answer did not (a younger claimant came)
			// is no change.
			was := old.indexes[id]
			is.chosen = t.src.settle(i, m, func(key string) []string { return raw[key] }, was.chosen)
			for key := range m {
				answer := raw[key]
				if c, ok := is.chosen[key]; ok {
					answer = c.values
				}
				if !slices.Equal(answer, was.values.lookup(s.seed, key)) {
					values = append(values, change{hash: s.hash(key), key: key, values: answer})
					if s.onCommit != nil {
						keys = append(keys, key)
					}
				}
			}
		}
		var delta int
		is.values, delta = is.values.update(values)
		is.keys += delta
		if len(objects) > 0 {
			o, _ := is.objects.update(objects)
			is.objects = &o
		}
		// Spread the index over more pages when it has outgrown its
		// pages fourfold, and over fewer when it has shrunk as much: a
		// key count going up and down by less than that never rehashes,
		// and a rehash, which costs the index, follows as many writes.
		if bits := bitsFor(is.keys); bits > is.values.bits+1 || bits+1 < is.values.bits {
			is.values = is.values.rehash(bits, s.hash)
			if is.objects != nil {
				o := is.objects.rehash(bits, s.hash)
				is.objects = &o
			}
		}
		next.indexes[id] = &is
		if len(keys) > 0 {
			changes = append(changes, Change{Index: s.handle(id), Keys: keys})
		}
	}
	if len(t.payloads) > 0 || t.count != 0 {
		next.sources = slices.Clone(old.sources)
		ss := *old.sources[t.src.id]
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
		// A clone keeps the room of the shard's deleted payloads: give it
		// back when a shard has shrunk a lot (see shrunk), and drop a
		// shard left empty (a nil shard reads as empty, as after rebuild).
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
		next.sources[t.src.id] = &ss
	}
	s.publish(next, changes)
	t.src.tellConflicts()
}

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
	empty := len(src.objects) == 0
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
		if old, ok := src.objects[o.Key]; ok && old == o.enc && samePayload(snap, src, o) {
			continue
		}
		tx.Put(*o)
	}
	var gone []string
	for key := range src.objects {
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

	objects := make(map[string]string, len(objs))
	payloads := map[string]any{}
	for i := range objs {
		o := &objs[i]
		src.Prepare(o)
		key := o.Key
		objects[key] = o.enc
		if o.Payload != nil {
			payloads[key] = o.Payload
			src.payloads = true
		} else {
			delete(payloads, key)
		}
	}

	old := s.current.Load()
	next := old.derive()
	next.indexes, next.sources = slices.Clone(old.indexes), slices.Clone(old.sources)
	var published []Change
	// Decode every object once; count entries per index to size the maps.
	type decoded struct {
		key     string
		entries [][]Entry
	}
	all := make([]decoded, 0, len(objects))
	counts := make([]int, len(src.indexes))
	for objKey, enc := range objects {
		es := decode(enc, objKey, len(src.indexes))
		for i := range es {
			counts[i] += len(es[i])
		}
		all = append(all, decoded{objKey, es})
	}
	for i, id := range src.indexes {
		values := make(map[string][]string, counts[i])
		var objectsOf map[string][]string
		if src.withObjects {
			objectsOf = make(map[string][]string, counts[i])
		}
		for _, d := range all {
			es := d.entries[i]
			for j, e := range es {
				values[e.Key] = append(values[e.Key], e.Value)
				if objectsOf != nil && (j == 0 || es[j-1].Key != e.Key) {
					objectsOf[e.Key] = append(objectsOf[e.Key], d.key)
				}
			}
		}
		dups := map[Entry]*int32{}
		bits := bitsFor(len(values))
		// Keys and values are copied out of the encodings (see
		// Source.objects), each distinct value once: single maps each to
		// a one-value slice of its copy, which every key whose only value
		// it is shares. One map serves both, for one lookup per value.
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
		if was := old.indexes[id]; s.onCommit != nil && was.keys > 0 {
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
		if src.unique[i] {
			src.objects = objects // what chooseAll reads
			src.chooseAll(i, is)
		}
		next.indexes[id] = is
		if keys != nil {
			published = append(published, Change{Index: s.handle(id), Keys: keys})
		}
	}
	ss := &sourceSnap{objects: len(objects)}
	for key, p := range payloads {
		sh := src.s.shardOf(key)
		if ss.payload[sh] == nil {
			ss.payload[sh] = map[string]any{}
		}
		ss.payload[sh][key] = p
	}
	next.sources[src.id] = ss
	for sh := range ss.payload {
		src.payloadPeak[sh] = len(ss.payload[sh])
	}
	src.objects = objects
	src.objectsPeak = len(objects)
	s.publish(next, published)
	src.tellConflicts()
}
