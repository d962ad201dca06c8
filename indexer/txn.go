package indexer

import (
	"maps"
	"slices"
	"sort"
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
	base       posting
	addV, remV map[string]struct{}
	addO, remO map[string]struct{}
}

// Begin starts a transaction on the source, waiting for other writers.
func (src *Source) Begin() *Txn {
	src.s.mu.Lock()
	return &Txn{src: src, work: make([]map[string]*work, len(src.indexes))}
}

// Put sets an object: its entries replace whatever it contributed before,
// and its payload replaces the previous one. Put sorts o.Entries in place.
func (t *Txn) Put(o Object) {
	src := t.src
	old := src.objects[o.Key]
	st := &objectState{payload: o.Payload, entries: make([][]Entry, len(src.indexes))}
	for i := range src.indexes {
		if i < len(o.Entries) {
			st.entries[i] = normalize(o.Entries[i])
		}
		var before []Entry
		if old != nil {
			before = old.entries[i]
		}
		t.diff(i, o.Key, before, st.entries[i])
	}
	if old == nil {
		t.count++
	}
	src.objects[o.Key] = st
	t.setPayload(o.Key, o.Payload, old != nil && old.payload != nil)
}

// Delete removes an object and everything it contributed. Deleting an
// unknown object does nothing.
func (t *Txn) Delete(objectKey string) {
	src := t.src
	old := src.objects[objectKey]
	if old == nil {
		return
	}
	for i := range src.indexes {
		t.diff(i, objectKey, old.entries[i], nil)
	}
	t.count--
	delete(src.objects, objectKey)
	t.setPayload(objectKey, nil, old.payload != nil)
}

func (t *Txn) setPayload(objectKey string, p any, had bool) {
	if p == nil && !had {
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
	// The object is listed under the distinct keys of its entries.
	oldKeys, newKeys := distinctKeys(before), distinctKeys(after)
	a, b = 0, 0
	for a < len(oldKeys) || b < len(newKeys) {
		switch {
		case b == len(newKeys) || (a < len(oldKeys) && oldKeys[a] < newKeys[b]):
			toggle(&t.workFor(i, oldKeys[a]).remO, &t.workFor(i, oldKeys[a]).addO, object)
			a++
		case a == len(oldKeys) || oldKeys[a] > newKeys[b]:
			toggle(&t.workFor(i, newKeys[b]).addO, &t.workFor(i, newKeys[b]).remO, object)
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
		s := t.src.s
		w = &work{base: s.current.Load().lookup(t.src.indexes[i], key)}
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
	_, found := slices.BinarySearch(w.base.values, value)
	return found
}

func (t *Txn) addValue(i int, e Entry) {
	w := t.workFor(i, e.Key)
	if w.has(e.Value) {
		t.src.dups[i][e]++
		return
	}
	toggle(&w.addV, &w.remV, e.Value)
}

func (t *Txn) removeValue(i int, e Entry) {
	dups := t.src.dups[i]
	if d := dups[e]; d > 0 {
		if d == 1 {
			delete(dups, e)
		} else {
			dups[e] = d - 1
		}
		return
	}
	toggle(&t.workFor(i, e.Key).remV, &t.workFor(i, e.Key).addV, e.Value)
}

// apply returns base with rem removed and add added, sorted. It returns
// base itself when nothing changes.
func apply(base []string, add, rem map[string]struct{}) []string {
	if len(add) == 0 && len(rem) == 0 {
		return base
	}
	out := make([]string, 0, len(base)+len(add))
	for _, v := range base {
		if _, gone := rem[v]; !gone {
			out = append(out, v)
		}
	}
	for v := range add {
		out = append(out, v)
	}
	sort.Strings(out)
	if len(out) == 0 {
		return nil
	}
	return out
}

// Commit publishes the transaction and releases the writer lock.
func (t *Txn) Commit() {
	s := t.src.s
	defer s.mu.Unlock()
	old := s.current.Load()
	next := &Snapshot{s: s, indexes: old.indexes, sources: old.sources}
	changed := false
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
		var cloned [numShards]bool
		for key, w := range m {
			sh := s.shardOf(key)
			if !cloned[sh] {
				is.shards[sh] = cloneShard(is.shards[sh])
				cloned[sh] = true
			}
			p := posting{values: apply(w.base.values, w.addV, w.remV), objects: apply(w.base.objects, w.addO, w.remO)}
			_, had := is.shards[sh][key]
			switch {
			case len(p.values) == 0 && len(p.objects) == 0:
				if had {
					delete(is.shards[sh], key)
					is.keys--
				}
			default:
				if !had {
					is.keys++
				}
				is.shards[sh][key] = p
			}
		}
		next.indexes[id] = &is
	}
	if len(t.payloads) > 0 || t.count != 0 {
		next.sources = slices.Clone(old.sources)
		ss := *old.sources[t.src.id]
		ss.objects += t.count
		var cloned [numShards]bool
		for key, p := range t.payloads {
			sh := s.shardOf(key)
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
		next.sources[t.src.id] = &ss
	}
	s.current.Store(next)
}

func cloneShard(sh shard) shard {
	if sh == nil {
		return shard{}
	}
	return maps.Clone(sh)
}

// Replace sets the source's objects to exactly objs: objects that objs lacks
// are removed, as after a relist. It rebuilds the source's indexes from
// scratch rather than patching them, so whatever the previous state, the
// result equals that of putting objs into an empty source. When objs holds
// an object key twice, the last one wins. Replace sorts each object's
// entries in place.
func (src *Source) Replace(objs []Object) {
	s := src.s
	s.mu.Lock()
	defer s.mu.Unlock()

	objects := make(map[string]*objectState, len(objs))
	for _, o := range objs {
		st := &objectState{payload: o.Payload, entries: make([][]Entry, len(src.indexes))}
		for i := range src.indexes {
			if i < len(o.Entries) {
				st.entries[i] = normalize(o.Entries[i])
			}
		}
		objects[o.Key] = st
	}

	old := s.current.Load()
	next := &Snapshot{s: s, indexes: slices.Clone(old.indexes), sources: slices.Clone(old.sources)}
	type acc struct{ values, objects []string }
	for i, id := range src.indexes {
		byKey := map[string]*acc{}
		for objKey, st := range objects {
			for j, e := range st.entries[i] {
				a := byKey[e.Key]
				if a == nil {
					a = &acc{}
					byKey[e.Key] = a
				}
				a.values = append(a.values, e.Value)
				if j == 0 || st.entries[i][j-1].Key != e.Key {
					a.objects = append(a.objects, objKey)
				}
			}
		}
		dups := map[Entry]int32{}
		is := &indexSnap{keys: len(byKey)}
		for key, a := range byKey {
			sort.Strings(a.values)
			distinct := a.values[:0]
			for _, v := range a.values {
				if len(distinct) > 0 && distinct[len(distinct)-1] == v {
					dups[Entry{Key: key, Value: v}]++
					continue
				}
				distinct = append(distinct, v)
			}
			sort.Strings(a.objects)
			sh := s.shardOf(key)
			if is.shards[sh] == nil {
				is.shards[sh] = shard{}
			}
			is.shards[sh][key] = posting{values: slices.Clip(distinct), objects: a.objects}
		}
		src.dups[i] = dups
		next.indexes[id] = is
	}
	ss := &sourceSnap{objects: len(objects)}
	for key, st := range objects {
		if st.payload == nil {
			continue
		}
		sh := s.shardOf(key)
		if ss.payload[sh] == nil {
			ss.payload[sh] = map[string]any{}
		}
		ss.payload[sh][key] = st.payload
	}
	next.sources[src.id] = ss
	src.objects = objects
	s.current.Store(next)
}
