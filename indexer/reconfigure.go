package indexer

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync/atomic"
)

// Reconfigure makes specs the store's sources, as one commit: readers see
// the old sources and indexes or the new ones, never a mix.
//
//   - A source named in specs and in the store is kept, with its objects:
//     its indexes that specs still gives it keep their contents (and their
//     handles); indexes it gains start empty; indexes it loses are
//     retired. A change of SourceSpec.Objects builds or drops the object
//     keys of its indexes from what the source holds. Objects prepared
//     for the old indexes must not be written after it: prepare them
//     again.
//   - A source that specs no longer names is removed: its indexes are
//     retired and its writer's later writes change nothing.
//   - A source new to the store starts empty.
//
// A retired index is empty, and its handles look up nothing; an index name
// that moves from one source to another is retired and made anew. Ids are
// never reused, so a handle never reads another index than its own.
//
// Reconfigure waits for the writers of every source (it takes every
// source's writer lock) and holds them all while it works.
//
// meta, when not nil, is called under every writer lock with the live sources
// by name and the snapshot about to be published (to find the handles of
// its indexes: its Meta is not set yet); what meta returns is published
// with it (see Snapshot.Meta). Reconfigure returns the handles of the retired indexes.
// Nothing is changed when specs are invalid (a name declared twice).
func (s *Store) Reconfigure(specs []SourceSpec, meta func(sources map[string]*Source, next *Snapshot) any) (retired []Index, err error) {
	if err := checkSpecs(specs); err != nil {
		return nil, err
	}

	defer s.runHooks() // once every lock is let go
	s.wide.Lock()
	defer s.wide.Unlock()
	locked := s.lockSources()
	defer func() {
		for _, src := range locked {
			src.mu.Unlock()
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.current.Load()
	next := old.derive()
	next.indexes, next.sources = slices.Clone(old.indexes), slices.Clone(old.sources)
	names := map[string]int{}
	// The index ids that each kept source may keep: by name.
	kept := map[string]int{}
	for _, spec := range specs {
		if id, ok := s.srcName[spec.Name]; ok {
			for _, ixID := range s.sources[id].indexes {
				kept[s.nameOf(old, ixID)] = ixID
			}
		}
	}
	live := map[int]bool{} // index ids that stay
	var changes []Change   // of answers, by indexes becoming unique or not
	srcNames := map[string]int{}
	for _, spec := range specs {
		var src *Source
		if id, ok := s.srcName[spec.Name]; ok {
			src = s.sources[id]
		} else {
			src = &Source{s: s, id: len(s.sources), name: spec.Name, objects: newObjectSet(s.seed, 0)}
			src.mu.Lock() // no writer has it yet: held with the others
			locked = append(locked, src)
			s.sources = append(s.sources, src)
			next.sources = append(next.sources, &sourceSnap{})
		}
		srcNames[spec.Name] = src.id
		unique := make([]bool, len(spec.Indexes))
		for i, name := range spec.Indexes {
			unique[i] = slices.Contains(spec.Unique, name)
		}
		ids := make([]int, len(spec.Indexes))
		for i, name := range spec.Indexes {
			if id, ok := kept[name]; ok && slices.Contains(src.indexes, id) {
				ids[i] = id
			} else {
				ids[i] = len(s.heads)
				head := &atomic.Pointer[indexSnap]{}
				head.Store(emptyIndex)
				s.heads = append(s.heads, head)
				next.indexes = append(next.indexes, emptyIndex)
			}
			names[name] = ids[i]
			live[ids[i]] = true
		}
		changes = append(changes, src.relayout(next, ids, spec.Objects || spec.Parts, unique)...)
		src.tellParts = spec.Parts
	}
	for name, id := range s.srcName {
		if _, stays := srcNames[name]; stays {
			continue
		}
		src := s.sources[id]
		src.removed = true
		src.indexes = nil
		src.width.Store(0)
		src.objects, src.dups, src.dupsPeak = newObjectSet(s.seed, 0), nil, nil
		src.unique, src.claims, src.singles = nil, nil, nil
		next.sources[id] = &sourceSnap{}
	}
	for _, id := range old.conf.names {
		if !live[id] {
			next.indexes[id] = emptyIndex
			retired = append(retired, s.handle(id))
		}
	}
	s.srcName = srcNames
	heads := slices.Clip(slices.Clone(s.heads))
	next.conf = configOf(specs, names, heads)
	if meta != nil {
		live := make(map[string]*Source, len(srcNames))
		for name, id := range srcNames {
			live[name] = s.sources[id]
		}
		next.conf.meta = meta(live, next)
	}
	s.publish(next, changes, true, s.sources...)
	if len(changes) == 0 {
		s.queueHook(old, next, func() []Change { return nil })
	}
	for _, id := range srcNames {
		s.sources[id].tellConflicts()
	}
	return retired, nil
}

// checkSpecs checks a layout before Reconfigure touches anything: names
// unique, and each fallback, hints and unique index one of its source's
// indexes, serving one index, with no companions of its own.
func checkSpecs(specs []SourceSpec) error {
	srcSeen, ixSeen := map[string]bool{}, map[string]bool{}
	for _, spec := range specs {
		if srcSeen[spec.Name] {
			return fmt.Errorf("source %q declared twice", spec.Name)
		}
		srcSeen[spec.Name] = true
		for _, name := range spec.Indexes {
			if ixSeen[name] {
				return fmt.Errorf("index %q declared twice", name)
			}
			ixSeen[name] = true
		}
		backs := map[string]string{}
		for primary, fb := range spec.Fallbacks {
			switch {
			case !slices.Contains(spec.Indexes, primary):
				return fmt.Errorf("source %q: index %q has a fallback but is not one of its indexes", spec.Name, primary)
			case !slices.Contains(spec.Indexes, fb):
				return fmt.Errorf("source %q: fallback %q of index %q is not one of its indexes", spec.Name, fb, primary)
			case primary == fb:
				return fmt.Errorf("source %q: index %q is its own fallback", spec.Name, fb)
			case spec.Fallbacks[fb] != "":
				return fmt.Errorf("source %q: fallback %q of index %q has a fallback of its own", spec.Name, fb, primary)
			case backs[fb] != "":
				return fmt.Errorf("source %q: %q is the fallback of both %q and %q", spec.Name, fb, backs[fb], primary)
			}
			backs[fb] = primary
		}
		for _, name := range spec.Unique {
			switch {
			case !slices.Contains(spec.Indexes, name):
				return fmt.Errorf("source %q: unique index %q is not one of its indexes", spec.Name, name)
			case spec.Fallbacks[name] != "" || spec.Hints[name] != "" || backs[name] != "" || slices.Contains(slices.Collect(maps.Values(spec.Hints)), name):
				return fmt.Errorf("source %q: unique index %q has a fallback or hints, or is one", spec.Name, name)
			}
		}
		for primary, h := range spec.Hints {
			switch {
			case !slices.Contains(spec.Indexes, primary):
				return fmt.Errorf("source %q: index %q has hints but is not one of its indexes", spec.Name, primary)
			case !slices.Contains(spec.Indexes, h):
				return fmt.Errorf("source %q: hints %q of index %q is not one of its indexes", spec.Name, h, primary)
			case primary == h || backs[h] != "" || spec.Fallbacks[h] != "" || spec.Hints[h] != "":
				return fmt.Errorf("source %q: hints %q of index %q serve another index or have companions of their own", spec.Name, h, primary)
			}
			backs[h] = primary
		}
	}
	return nil
}

// configOf is the configuration of a layout: index ids by name, and each
// index's companions (fallback, hints).
func configOf(specs []SourceSpec, names map[string]int, heads []*atomic.Pointer[indexSnap]) *config {
	conf := &config{names: names, heads: heads}
	for _, spec := range specs {
		if len(spec.Fallbacks)+len(spec.Hints) > 0 && conf.companionOf == nil {
			conf.fallback, conf.hints, conf.companionOf = map[int]int{}, map[int]int{}, map[int]int{}
		}
		for primary, fb := range spec.Fallbacks {
			conf.fallback[names[primary]] = names[fb]
			conf.companionOf[names[fb]] = names[primary]
		}
		for primary, h := range spec.Hints {
			conf.hints[names[primary]] = names[h]
			conf.companionOf[names[h]] = names[primary]
		}
	}
	conf.served, conf.companion = make([]bool, len(heads)), make([]bool, len(heads))
	for id := range conf.companionOf {
		conf.companion[id] = true
	}
	for id := range conf.fallback {
		conf.served[id] = true
	}
	for id := range conf.hints {
		conf.served[id] = true
	}
	return conf
}

// lockSources takes the writer lock of every source, by id, and returns
// them; under wide, before mu (see Store.wide).
func (s *Store) lockSources() []*Source {
	// s.sources changes only under wide, which the caller holds.
	srcs := slices.Clone(s.sources)
	for _, src := range srcs {
		src.mu.Lock()
	}
	return srcs
}

// nameOf returns the name of a live index of snap.
func (s *Store) nameOf(snap *Snapshot, id int) string {
	for name, i := range snap.conf.names {
		if i == id {
			return name
		}
	}
	return ""
}

// relayout gives the source the index ids ids (each either one of its
// own, whose contents stay, or a new, empty one), and keeps object keys
// per index key when withObjects. It re-encodes every object's entries
// for the new order of indexes, and chooses the answers of the indexes
// that become unique (unique[i]: the i-th is), returning the keys whose
// answers that changes; under every lock (Reconfigure's), for next.
func (src *Source) relayout(next *Snapshot, ids []int, withObjects bool, unique []bool) []Change {
	wasUnique := map[int]bool{}
	for i, id := range src.indexes {
		wasUnique[id] = src.unique[i]
	}
	sameUnique := slices.Equal(unique, src.unique)
	if slices.Equal(ids, src.indexes) && withObjects == src.withObjects && sameUnique {
		return nil
	}
	pos := map[int]int{} // old index id -> its position in the old order
	for i, id := range src.indexes {
		pos[id] = i
	}
	dups := make([]map[Entry]*int32, len(ids))
	dupsPeak := make([]int, len(ids))
	for i, id := range ids {
		if p, ok := pos[id]; ok {
			dups[i], dupsPeak[i] = src.dups[p], src.dupsPeak[p]
		} else {
			dups[i] = map[Entry]*int32{}
		}
	}
	if !slices.Equal(ids, src.indexes) {
		for key, enc := range src.objects.All() {
			was := decode(enc, key, len(src.indexes))
			now := make([][]Entry, len(ids))
			for i, id := range ids {
				if p, ok := pos[id]; ok {
					now[i] = was[p]
				}
			}
			head, _ := splitMeta(enc)
			rec, _, _ := newRecord(key, []byte(head), now)
			src.objects.Put(rec) // the key's slot: the loop goes on
		}
	}
	claims := make([]map[string][]claim, len(ids))
	singles := make([]map[string]struct{}, len(ids))
	for i, id := range ids {
		if p, ok := pos[id]; ok && unique[i] && wasUnique[id] {
			claims[i], singles[i] = src.claims[p], src.singles[p]
		}
	}
	src.indexes, src.dups, src.dupsPeak = ids, dups, dupsPeak
	src.unique, src.claims, src.singles = unique, claims, singles
	src.width.Store(int32(len(ids)))
	if withObjects != src.withObjects {
		src.withObjects = withObjects
		for i, id := range ids {
			if next.indexes[id] == emptyIndex {
				next.indexes[id] = &indexSnap{values: newTable(0), sorted: &sortedKeys{}}
			}
			is := *next.indexes[id]
			is.objects = nil
			if withObjects {
				o := src.objectsTable(i, is.values.bits)
				is.objects = &o
			}
			next.indexes[id] = &is
		}
	}
	for _, id := range ids {
		if next.indexes[id] == emptyIndex {
			is := &indexSnap{values: newTable(0), sorted: &sortedKeys{}}
			if withObjects {
				o := newTable(0)
				is.objects = &o
			}
			next.indexes[id] = is
		}
	}
	var changes []Change
	for i, id := range ids {
		if unique[i] == wasUnique[id] {
			continue
		}
		is := *next.indexes[id]
		is.sorted = &sortedKeys{}
		was := is.chosen
		is.unchoose(src.s)
		if unique[i] {
			src.claims[i] = map[string][]claim{}
			src.chooseAll(i, &is)
			was = is.chosen
		}
		next.indexes[id] = &is
		if was.count() > 0 {
			changes = append(changes, Change{Index: src.s.handle(id), Keys: was.keys()})
		}
	}
	return changes
}

// objectsTable builds, from the source's objects, the object keys behind
// each index key of its i-th index.
func (src *Source) objectsTable(i int, bits uint) table {
	of := map[string][]string{}
	for key, enc := range src.objects.All() {
		es := decode(enc, key, len(src.indexes))[i]
		for j, e := range es {
			if j == 0 || es[j-1].Key != e.Key {
				of[e.Key] = append(of[e.Key], key)
			}
		}
	}
	changes := make([]change, 0, len(of))
	var in interner
	for k, objs := range of {
		sort.Strings(objs)
		for j := range objs {
			objs[j] = in.clone(objs[j])
		}
		k = in.clone(k)
		changes = append(changes, change{hash: src.s.hash(k), key: k, values: slices.Clip(objs)})
	}
	return build(bits, changes)
}
