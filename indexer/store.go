package indexer

import (
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
)

// shardBits sets the number of shards per index (1<<shardBits). A write
// copies the shards it touches, so more shards make writes to large indexes
// cheaper; reads cost the same whatever the number.
const (
	shardBits = 8
	numShards = 1 << shardBits
)

// Entry is one (index key, index value) pair that an object contributes to
// one index.
type Entry struct {
	Key   string
	Value string
}

// Object is one source object as the writer hands it to a Source: its object
// key, an optional opaque payload, and its entries for each index of the
// source, in the order of SourceSpec.Indexes. Entries need not be sorted or
// distinct.
type Object struct {
	Key     string
	Payload any
	Entries [][]Entry
}

// SourceSpec declares a source and the names of the indexes it feeds.
type SourceSpec struct {
	Name    string
	Indexes []string
}

// Store holds the indexes of every source. Its zero value is not usable;
// build one with New.
type Store struct {
	seed    maphash.Seed
	current atomic.Pointer[Snapshot]

	mu      sync.Mutex // serializes writers
	sources []*Source
	byName  map[string]int // index name -> index id
	srcName map[string]int // source name -> source id
}

// Index is a handle on one index of a Store, cheaper to look up with than
// its name.
type Index struct {
	s  *Store
	id int
}

// Source is the writer's handle on one source of a Store.
type Source struct {
	s       *Store
	id      int
	name    string
	indexes []int // index ids, in SourceSpec order

	// Writer state, guarded by s.mu.
	objects map[string]*objectState
	dups    []map[Entry]int32 // per source index: extra contributors of an entry
}

// objectState is what the writer remembers of an object: its normalized
// entries, so that an update or delete can withdraw exactly them.
type objectState struct {
	payload any
	entries [][]Entry // sorted by (Key, Value), distinct
}

// posting is the published answer for one index key.
type posting struct {
	values  []string // distinct, sorted
	objects []string // object keys that contribute under this key; distinct, sorted
}

type shard = map[string]posting

type indexSnap struct {
	keys   int
	shards [numShards]shard
}

type sourceSnap struct {
	objects int
	payload [numShards]map[string]any
}

// Snapshot is an immutable view of every index of a Store at one instant.
// Reads of one Snapshot are mutually consistent, which makes it the right
// tool for a chain of lookups.
type Snapshot struct {
	s       *Store
	indexes []*indexSnap
	sources []*sourceSnap
}

// New builds a Store with the given sources. Index names must be unique
// across all sources, source names among sources.
func New(sources ...SourceSpec) (*Store, error) {
	s := &Store{
		seed:    maphash.MakeSeed(),
		byName:  map[string]int{},
		srcName: map[string]int{},
	}
	snap := &Snapshot{s: s}
	for _, spec := range sources {
		if _, dup := s.srcName[spec.Name]; dup {
			return nil, fmt.Errorf("source %q declared twice", spec.Name)
		}
		src := &Source{s: s, id: len(s.sources), name: spec.Name, objects: map[string]*objectState{}}
		s.srcName[spec.Name] = src.id
		for _, name := range spec.Indexes {
			if _, dup := s.byName[name]; dup {
				return nil, fmt.Errorf("index %q declared twice", name)
			}
			id := len(snap.indexes)
			s.byName[name] = id
			src.indexes = append(src.indexes, id)
			src.dups = append(src.dups, map[Entry]int32{})
			snap.indexes = append(snap.indexes, &indexSnap{})
		}
		s.sources = append(s.sources, src)
		snap.sources = append(snap.sources, &sourceSnap{})
	}
	s.current.Store(snap)
	return s, nil
}

// Index returns the handle of the named index.
func (s *Store) Index(name string) (Index, bool) {
	id, ok := s.byName[name]
	if !ok {
		return Index{}, false
	}
	return Index{s: s, id: id}, true
}

// Source returns the writer handle of the named source, or nil.
func (s *Store) Source(name string) *Source {
	id, ok := s.srcName[name]
	if !ok {
		return nil
	}
	return s.sources[id]
}

// Snapshot returns the current snapshot. It never blocks.
func (s *Store) Snapshot() *Snapshot { return s.current.Load() }

// Lookup returns the values of key in the named index: distinct, sorted,
// nil when there are none or the index is unknown. The slice is shared:
// callers must not modify it.
func (s *Store) Lookup(index, key string) []string {
	id, ok := s.byName[index]
	if !ok {
		return nil
	}
	return s.current.Load().lookup(id, key).values
}

// Lookup returns the values of key in this index; see Store.Lookup. It
// allocates nothing.
func (ix Index) Lookup(key string) []string {
	return ix.s.current.Load().lookup(ix.id, key).values
}

func (s *Store) shardOf(key string) int {
	return int(maphash.String(s.seed, key) >> (64 - shardBits))
}

func (snap *Snapshot) lookup(id int, key string) posting {
	return snap.indexes[id].shards[snap.s.shardOf(key)][key]
}

// Lookup returns the values of key in ix as of this snapshot.
func (snap *Snapshot) Lookup(ix Index, key string) []string {
	return snap.lookup(ix.id, key).values
}

// Objects returns the object keys of the objects that contribute under key
// in ix: distinct, sorted, shared (do not modify).
func (snap *Snapshot) Objects(ix Index, key string) []string {
	return snap.lookup(ix.id, key).objects
}

// KeyCount returns the number of index keys in ix.
func (snap *Snapshot) KeyCount(ix Index) int { return snap.indexes[ix.id].keys }

// Keys returns every index key of ix, sorted. It allocates.
func (snap *Snapshot) Keys(ix Index) []string {
	is := snap.indexes[ix.id]
	keys := make([]string, 0, is.keys)
	for _, sh := range is.shards {
		for k := range sh {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// Payload returns the payload of an object of src, if it has one.
func (snap *Snapshot) Payload(src *Source, objectKey string) (any, bool) {
	p, ok := snap.sources[src.id].payload[snap.s.shardOf(objectKey)][objectKey]
	return p, ok
}

// ObjectCount returns the number of objects of src.
func (snap *Snapshot) ObjectCount(src *Source) int { return snap.sources[src.id].objects }

// Resolve follows a chain of indexes: the values of each step are the keys
// of the next. It returns the distinct values of the last step, sorted, or
// nil. It allocates.
func (snap *Snapshot) Resolve(chain []Index, key string) []string {
	keys := []string{key}
	for _, ix := range chain {
		if len(keys) == 1 {
			keys = snap.Lookup(ix, keys[0])
			continue
		}
		var next []string
		for _, k := range keys {
			next = append(next, snap.Lookup(ix, k)...)
		}
		slices.Sort(next)
		keys = slices.Compact(next)
	}
	if len(keys) == 0 {
		return nil
	}
	return slices.Clone(keys)
}

// Name returns the source's name.
func (src *Source) Name() string { return src.name }

// normalize sorts entries and drops duplicates, in place.
func normalize(es []Entry) []Entry {
	if len(es) < 2 {
		return es
	}
	slices.SortFunc(es, compareEntry)
	return slices.Compact(es)
}

func compareEntry(a, b Entry) int {
	if a.Key != b.Key {
		if a.Key < b.Key {
			return -1
		}
		return 1
	}
	if a.Value != b.Value {
		if a.Value < b.Value {
			return -1
		}
		return 1
	}
	return 0
}
