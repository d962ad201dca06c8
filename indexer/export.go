package indexer

import (
	"slices"
	"strings"
)

// Image is a Source's content as of one commit, to be saved: its index
// tables and its objects. It is taken by Source.Image and read without
// any lock, as often as needed.
type Image struct {
	src   *Source
	snap  *Snapshot
	ids   []int // the source's index ids at that commit
	width int
	objs  []imageObject
}

type imageObject struct{ key, enc string }

// Image copies the object table of src under its writer lock (two string
// headers per object; its writers wait only for that) and keeps the snapshot
// of the same commit. A source that a Reconfigure removed gives an empty
// Image.
func (src *Source) Image() *Image {
	src.mu.Lock()
	defer src.mu.Unlock()
	// The source's part of the current snapshot is of the commit that
	// left its objects so: only a holder of src.mu publishes it.
	img := &Image{src: src, snap: src.s.current.Load()}
	if src.removed {
		return img
	}
	img.ids, img.width = slices.Clone(src.indexes), len(src.indexes)
	img.objs = make([]imageObject, 0, src.objects.Len())
	for k, enc := range src.objects.All() {
		img.objs = append(img.objs, imageObject{k, enc})
	}
	return img
}

// Indexes returns the number of indexes of the source.
func (img *Image) Indexes() int { return len(img.ids) }

// WithObjects reports whether the source keeps the object keys behind
// each index key (SourceSpec.Objects).
func (img *Image) WithObjects() bool { return img.src.withObjects }

// Table calls f with every key of the source's i-th index, its values
// (distinct, sorted) and, WithObjects, the object keys behind it (likewise),
// in no particular order.
func (img *Image) Table(i int, f func(key string, values, objects []string)) {
	is := img.snap.indexes[img.ids[i]]
	is.values.all(func(key string, values []string) {
		var objects []string
		if is.objects != nil {
			objects = is.objects.lookup(img.src.s.seed, key)
		}
		f(key, values, objects)
	})
}

// Keys calls f with the key of every object, in the order Objects
// gives them.
func (img *Image) Keys(f func(key string)) {
	for _, o := range img.objs {
		f(o.key)
	}
}

// Objects calls f with every object: its key, its provenance, its entries
// for each index (normalized: sorted, distinct) and its payload (nil if it
// has none), in
// no particular order, and returns how many there were. The entries are
// f's only until it returns; the key and the entries' strings are parts of
// what the source keeps of the object (copy what outlives the image).
func (img *Image) Objects(f func(key string, meta Meta, entries [][]Entry, payload any)) int {
	buf := make([][]Entry, img.width)
	for _, o := range img.objs {
		var payload any
		if p, ok := img.snap.Payload(img.src, o.key); ok {
			payload = p
		}
		f(o.key, decodeMeta(o.enc), decodeInto(buf, o.enc, o.key), payload)
	}
	return len(img.objs)
}

// SavedIndex is one index of a saved Image, for Load: its keys, each
// with its values and object keys as numbers in Load's strings.
type SavedIndex struct {
	Keys int // how many (a hint)
	Each func(f func(key string, values, objects []uint32))
}

// Load fills an empty source from what an Image saved, in two steps. At
// once, under the source's writer lock: the index tables from indexes (for each
// key, its values and, for a source with Objects, the object keys behind
// it, distinct and sorted; numbers in strs) and the payloads (f called by
// payloads with each object key and payload) are published: lookups
// answer from them when Load returns. Then, in the background, with the
// lock still held, objects() is written as Replace would write it into an
// empty source, which rebuilds the indexes from the objects and publishes
// them again (the same, for a saved Image). The source's writers wait
// until then (those of other sources do not); the returned channel is
// closed once they can write. The tables only speed
// up the first answers: what stays is what the objects say.
//
// A source that is not empty, or was removed, or has a unique index or
// Parts, is written by Replace instead, at once.
func (src *Source) Load(strs []string, indexes []SavedIndex, objectCount int, payloads func(f func(key string, payload any)), objects func() []Object) <-chan struct{} {
	done := make(chan struct{})
	s := src.s
	src.mu.Lock()
	// A unique index answers what its claims choose, which its saved
	// table alone cannot tell, and a part of a key (Snapshot.Part) is
	// read from the objects behind it, which are not there until the
	// rebuild: such a source is built from its objects at once.
	if src.removed || src.objects.Len() > 0 || len(indexes) != len(src.indexes) || slices.Contains(src.unique, true) || src.tellParts {
		src.mu.Unlock()
		src.Replace(objects())
		close(done)
		return done
	}
	clones := make([]string, len(strs))
	cloned := make([]bool, len(strs))
	ones := make([][]string, len(strs))
	str := func(id uint32) string {
		if !cloned[id] {
			clones[id], cloned[id] = strings.Clone(strs[id]), true
		}
		return clones[id]
	}
	list := func(ids []uint32) []string {
		if len(ids) == 1 {
			id := ids[0]
			if ones[id] == nil {
				ones[id] = []string{str(id)}
			}
			return ones[id]
		}
		out := make([]string, len(ids))
		for j, id := range ids {
			out[j] = str(id)
		}
		return out
	}
	states := make([]*indexSnap, len(src.indexes))
	for i := range src.indexes {
		changes := make([]change, 0, indexes[i].Keys)
		var objectsOf []change
		indexes[i].Each(func(key string, values, objs []uint32) {
			if len(values) == 0 {
				return
			}
			k := strings.Clone(key)
			h := s.hash(k)
			changes = append(changes, change{hash: h, key: k, values: list(values)})
			if src.withObjects {
				objectsOf = append(objectsOf, change{hash: h, key: k, values: list(objs)})
			}
		})
		bits := bitsFor(len(changes))
		is := &indexSnap{keys: len(changes), values: build(bits, changes), sorted: &sortedKeys{}}
		if src.withObjects {
			t := build(bits, objectsOf)
			is.objects = &t
		}
		states[i] = is
	}
	ss := &sourceSnap{objects: objectCount}
	payloads(func(key string, p any) {
		sh := s.shardOf(key)
		if ss.payload[sh] == nil {
			ss.payload[sh] = map[string]any{}
		}
		ss.payload[sh][strings.Clone(key)] = p
	})
	// No changes named: nothing was there before. The rebuild that follows
	// names every key it publishes and every key of these tables that it
	// drops.
	s.publishSource(src, states, ss, nil)
	go func() {
		defer close(done)
		defer src.mu.Unlock()
		src.rebuildLocked(objects())
	}()
	return done
}
