package indexer

import (
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
)

// An index's table is split into 1<<bits pages, bits chosen for about
// keysPerPage keys per page when the index is rebuilt, and raised when it
// outgrows that fourfold. A write copies the pages it touches, so pages
// keep writes to large indexes cheap. The pages are at most
// 1<<maxPageBits (4096): up to 4096 × 64 = 262,144 keys a write copies a
// page of about 64 keys; past that, pages grow with the index (a page of
// an index of a million keys holds about 244), and so does the cost of a
// write.
const (
	maxPageBits   = 12
	keysPerPage   = 64
	payloadShards = 256
)

// bitsFor returns the page bits for an index of n keys.
func bitsFor(n int) uint {
	var bits uint
	for bits < maxPageBits && n>>bits > keysPerPage {
		bits++
	}
	return bits
}

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
	// Meta is where the object's entries come from, kept with them for
	// Explain and for the oldest-claimant rule of unique indexes.
	Meta Meta

	// Set by Source.Prepare, which then drops Entries: a prepared object
	// holds its entries in one string only, its record (see objectSet);
	// enc, and Key, are substrings of it.
	rec, enc string
	prepared bool
}

// Meta is an object's provenance: the version its entries were read from
// (metasync keeps the resourceVersion) and when the object was created.
type Meta struct {
	Version string
	// Created is in seconds since 1970 (0: unknown). Of the claimants of
	// a key of a unique index, the object created first is answered (see
	// SourceSpec.Unique); one whose time is unknown ranks after those
	// whose time is known.
	Created int64
}

// SourceSpec declares a source and the names of the indexes it feeds.
type SourceSpec struct {
	Name    string
	Indexes []string
	// Objects keeps, for each index key, the object keys of the objects
	// behind it (Snapshot.Objects). It costs memory; leave it off unless
	// the objects' payloads are read by index key.
	Objects bool
	// Parts makes a commit tell (Store.OnCommit) a key whose givers
	// changed, even when its values did not: an object came to give, or
	// stopped giving, a value that another object gives too. A reader of
	// some objects' part of a key (Snapshot.Part) hears of it so. It needs
	// Objects.
	Parts bool
	// Fallbacks maps an index of the source to another of its indexes, its
	// fallback: a lookup of a key that has no values in the first answers
	// the key's values in its fallback (see Index.Lookup). Both are
	// written as any index is; a fallback is the fallback of one index
	// and has none of its own.
	Fallbacks map[string]string
	// Unique names indexes of the source whose keys each answer one
	// object's values: when several objects give a key different values
	// (a conflict), the key answers the values of the object created
	// first (Meta.Created; an unknown time ranks last), of the smallest
	// object key among those created in the same second, never a mix; when that object withdraws them,
	// the next oldest answers. A unique index has no fallback or hints.
	Unique []string
	// Hints maps an index of the source to another of its indexes, its
	// hints: under each index key, strings "VALUE\tKIND=NAME" that tag
	// the key's values (for instance "10.0.0.5:8080\tzone=a"), which
	// LookupPreferring reads. A hints index is the hints of one index.
	Hints map[string]string
}

// Store holds the indexes of every source. Its zero value is not usable;
// build one with New.
type Store struct {
	seed hashSeed // of every index key's hash
	// shardSeed seeds the hash that picks an object's payload shard
	// (shardOf), drawn per Store: object names are chosen by whoever may
	// create objects.
	shardSeed maphash.Seed
	current   atomic.Pointer[Snapshot]

	// The locks, always taken in this order: wide, the sources' (each
	// Source.mu, by source id), mu. A source's writer takes its source's
	// lock for its whole work, and mu only to publish: writers of
	// different sources never wait for each other's work, only for each
	// other's publication. The store-wide operations (Reconfigure,
	// Compact) take wide, then the lock of every source, then mu.
	//
	// wide serializes the store-wide operations.
	wide sync.Mutex
	// mu serializes publications: the step that loads the current
	// snapshot, puts a commit's states in it, publishes the result and
	// queues the call of the OnCommit function. It guards no writer
	// state.
	mu sync.Mutex
	// hooks are the OnCommit calls of published commits not made yet, in
	// commit order (under mu). hookMu is held by whoever makes them: one
	// at a time, outside mu, so that a slow hook delays no other
	// source's publication (see runHooks).
	hooks  []hookCall
	hookMu sync.Mutex
	// The hooks (nil: none), read by writers under their source's lock.
	onCommit atomic.Pointer[func(prev, next *Snapshot, changes []Change)]
	// onConflict hears of keys of unique indexes put in conflict.
	onConflict atomic.Pointer[func(ConflictNote)]
	// Changed under wide, every source's lock and mu; read under wide or
	// mu. Ids are never reused: a source or index that a Reconfigure
	// removes keeps its id, retired.
	sources []*Source
	srcName map[string]int // source name -> source id, of live sources
	heads   []*atomic.Pointer[indexSnap]
}

// hookCall is one OnCommit call to make.
type hookCall struct {
	f          func(prev, next *Snapshot, changes []Change)
	prev, next *Snapshot
	changes    func() []Change // computed by runHooks, outside mu
}

// Index is a handle on one index of a Store, cheaper to look up with than
// its name.
type Index struct {
	s    *Store
	id   int
	head *atomic.Pointer[indexSnap]
	seed hashSeed
}

// Source is the writer's handle on one source of a Store.
type Source struct {
	s    *Store
	id   int
	name string
	// mu serializes the source's writers: it guards the writer state
	// below (what the comments say is under mu), and the source's part of
	// the published state (its indexes' states, its sourceSnap and its
	// objects), which only a holder of mu publishes anew.
	mu      sync.Mutex
	indexes []int // index ids, in SourceSpec order (under mu)
	// width is len(indexes), for Prepare, which takes no lock: a decoder
	// that outlives its watcher may still prepare while a Reconfigure
	// changes the indexes (what it prepares is then never written).
	width       atomic.Int32
	withObjects bool
	tellParts   bool // SourceSpec.Parts (under mu)
	removed     bool // by a Reconfigure: writes change nothing (under mu)

	// Writer state, guarded by mu. objects holds each object's
	// normalized entries, encoded into one string with its object key (see
	// objectSet), so that an update or delete can withdraw exactly them.
	//
	// Nothing published, and nothing kept here but the records, shares
	// memory with a record: keys, values and object keys are copied when
	// they are published (once per write, see interner) or kept (a
	// transaction's work keys, claims), so that an object's old record
	// becomes garbage when it changes, and memory follows the current
	// state, not the history of writes.
	objects *objectSet
	decoded [2][][]Entry       // see scratch
	dups    []map[Entry]*int32 // per source index: extra contributors of an entry
	// unique[i]: the i-th index is unique (SourceSpec.Unique). claims[i],
	// of a unique index, holds the claims on each of its keys that have
	// more than one value (see settle).
	unique   []bool
	claims   []map[string][]claim
	singles  []map[string]struct{} // per index: keys of claims with one value
	scans    int                   // reads of every object by findClaims (for tests)
	prefixes prefixSet             // of object keys, to find claimants by name
	notes    []ConflictNote        // of the commit under way, for onConflict
	payloads bool                  // some object has had a payload

	// The largest count of each dups map and of each payload shard since
	// that map was made: a Go map never gives back the room of deleted
	// entries, so a map whose count falls far below its peak is copied
	// into one sized for what it holds (see shrunk). (objects gives back
	// its own room.)
	dupsPeak    []int
	payloadPeak [payloadShards]int
}

type indexSnap struct {
	// served: published with a configuration that gives the index a
	// fallback or hints (config.served), whose lookups read them and the
	// index from one snapshot. It sits in the state so that a lookup by
	// handle reads the flag and the state of one commit with one load:
	// read through the snapshot's configuration, it cost a hot lookup 2
	// ns of its 15; read from beside the state, a reader could pair one
	// commit's flag with another's state.
	served bool
	keys   int
	values table // index key -> index values: distinct, sorted
	// objects, when the source tracks them, maps index keys to the object
	// keys behind them: distinct, sorted.
	objects *table
	// sorted holds the index keys in order, computed at the first call of
	// Keys and shared by every later one on this snapshot of the index.
	sorted *sortedKeys
	// chosen, of a unique index, maps each key in conflict (claimed with
	// different values by several objects) to what it answers: the
	// oldest claimant's values, which the table holds for the key, so that
	// a lookup costs what it costs in any index. Never modified once
	// published.
	chosen *choices
	// preferred, of an index with hints, holds the answers of its keys
	// for each zone or node that their hints prefer (see prefer.go); nil
	// when no key has any.
	preferred *preferred
}

// choice is what a key in conflict answers, the values of one claimant,
// and the values of all, which the writer works from.
type choice struct {
	values []string // in the table
	object string   // the claimant's object key
	raw    []string // every claimant's values: distinct, sorted
}

type sortedKeys struct {
	once sync.Once
	keys []string
}

type sourceSnap struct {
	objects int
	payload [payloadShards]map[string]any
}

// Snapshot is an immutable view of every index of a Store at one instant.
// Reads of one Snapshot are mutually consistent, which makes it the right
// tool for a chain of lookups.
type Snapshot struct {
	seq    uint64 // commits before this one, since New
	writes uint64 // of which changed some index (see Writes)
	// compacted: Compact published this snapshot (another Compact has
	// nothing to do); compactedAt: writes as of the last Compact.
	compacted   bool
	compactedAt uint64
	s           *Store
	indexes     []*indexSnap  // by index id; a retired index is empty
	sources     []*sourceSnap // by source id
	conf        *config       // the sources and indexes, as of the last Reconfigure
	// objects holds each live source's objects as of this snapshot, by
	// source id (nil: removed), which Explain reads without a lock.
	objects []*sourceObjects
}

// sourceObjects is a source's objects in one snapshot: its writer's set
// as the commit left it, never changed after, and its indexes' ids in the
// order of its objects' entries.
type sourceObjects struct {
	indexes []int
	set     objectView
}

// config is what a Reconfigure publishes and every commit carries over:
// which names are live, and the engine's opaque view of them.
type config struct {
	names map[string]int // live index name -> index id
	// heads[id] is the current state of index id, published with each
	// snapshot: one load less for a lookup by handle than going through
	// the snapshot.
	heads []*atomic.Pointer[indexSnap]
	// fallback maps a live index id to its fallback's id, hints to its
	// hints' id; companionOf maps the id of a fallback or hints index to
	// the index it serves. served[id] says whether index id has either,
	// for the lookups of the others to pass by at the cost of one load.
	fallback, hints, companionOf map[int]int
	served                       []bool
	// companion[id]: index id is a fallback or hints, read only through
	// the index it serves: not found by its name.
	companion []bool
	meta      any
}

// companions returns the ids of the fallback and hints of index id (-1:
// none) in this configuration. Handles carry no companions: a reload
// that gives an index a fallback is read by the handles taken before it.
func (c *config) companions(id int) (fb, hints int) {
	if id >= len(c.served) || !c.served[id] {
		return -1, -1
	}
	fb, hints = -1, -1
	if f, ok := c.fallback[id]; ok {
		fb = f
	}
	if h, ok := c.hints[id]; ok {
		hints = h
	}
	return fb, hints
}

// derive starts the snapshot that follows snap: the same state, to be
// changed by a commit.
// Compacted reports whether Compact published snap: the values of the
// snapshot before it, in fresh memory.
func (snap *Snapshot) Compacted() bool { return snap.compacted }

func (snap *Snapshot) derive() *Snapshot {
	return &Snapshot{s: snap.s, indexes: snap.indexes, sources: snap.sources, conf: snap.conf, compactedAt: snap.compactedAt, objects: snap.objects}
}

// Meta returns what the last Reconfigure published with the layout of
// this snapshot (nil before any): a reader that loads one snapshot gets
// the indexes and the meta of one configuration.
func (snap *Snapshot) Meta() any { return snap.conf.meta }

// emptyIndex is the state of a retired index.
var emptyIndex = &indexSnap{values: newTable(0), sorted: &sortedKeys{}}

// New builds a Store with the given sources. Index names must be unique
// across all sources, source names among sources.
func New(sources ...SourceSpec) (*Store, error) {
	s := &Store{seed: newHashSeed(rand.Uint64()), shardSeed: maphash.MakeSeed(), srcName: map[string]int{}}
	s.current.Store(&Snapshot{s: s, conf: &config{names: map[string]int{}}})
	if _, err := s.Reconfigure(sources, nil); err != nil {
		return nil, err
	}
	return s, nil
}

// Index returns the handle of the named index.
func (s *Store) Index(name string) (Index, bool) {
	return s.current.Load().Index(name)
}

// Index returns the handle of the named index, if the snapshot has it.
//
// A fallback or hints index is not found: it is read through the index it
// serves.
func (snap *Snapshot) Index(name string) (Index, bool) {
	id, ok := snap.conf.names[name]
	if !ok || id < len(snap.conf.companion) && snap.conf.companion[id] {
		return Index{}, false
	}
	return snap.conf.handle(snap.s, id), true
}

// handle returns the handle of index id in the current configuration,
// which only changes under every source's lock: the caller holds one.
func (s *Store) handle(id int) Index {
	return s.current.Load().conf.handle(s, id)
}

// handle returns the handle of index id in this configuration.
func (c *config) handle(s *Store, id int) Index {
	return Index{s: s, id: id, head: c.heads[id], seed: s.seed}
}

// Change names the index keys whose values one commit changed in one index.
type Change struct {
	Index Index
	Keys  []string // distinct, in no order; shared with the store: do not modify
}

// OnCommit sets f, which every commit that changes the values of some
// index key calls once it has published next (prev is the snapshot that
// next replaced), with the keys that changed, per index. f runs after the
// publication, outside the store's publication lock (other sources publish
// meanwhile), one call at a time and in commit order (a commit's prev is
// the previous commit's next, whatever their sources); a write returns
// once f was called for it and every commit before it. It must be quick,
// must not block, and must not write to the store. Set it before the
// first write. Compact calls it
// too, with no changes: the values are the same, but a hook that keeps the
// latest snapshot should keep next, or the tables' memory from before
// Compact stays in use (next.Compacted() tells it). So does Reconfigure,
// with the changes of indexes that became unique or stopped being so, or
// none: once Reconfigure returns, f was called with its snapshot.
func (s *Store) OnCommit(f func(prev, next *Snapshot, changes []Change)) {
	if f == nil {
		s.onCommit.Store(nil)
		return
	}
	s.onCommit.Store(&f)
}

// commitHook returns the OnCommit function, or nil.
func (s *Store) commitHook() func(prev, next *Snapshot, changes []Change) {
	if f := s.onCommit.Load(); f != nil {
		return *f
	}
	return nil
}

// Source returns the writer handle of the named source, or nil.
func (s *Store) Source(name string) *Source {
	// mu, not wide: a Reconfigure that waits for a source's writer holds
	// wide.
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.srcName[name]
	if !ok {
		return nil
	}
	return s.sources[id]
}

// publishSource publishes a commit of src: the current snapshot with
// states[i] (nil: unchanged) as the state of the source's i-th index, and
// ss (nil: unchanged) as its sourceSnap. Under src.mu; it takes the
// publication lock. The source's part of the current snapshot is what its
// last publication left, from which its writer worked: only a holder of
// src.mu publishes it anew.
func (s *Store) publishSource(src *Source, states []*indexSnap, ss *sourceSnap, changes []Change) {
	states = s.preferSource(src, states)
	s.mu.Lock()
	old := s.current.Load()
	next := old.derive()
	cloned := false
	for i, is := range states {
		if is == nil {
			continue
		}
		if !cloned {
			next.indexes, cloned = slices.Clone(old.indexes), true
		}
		next.indexes[src.indexes[i]] = is
	}
	if ss != nil {
		next.sources = slices.Clone(old.sources)
		next.sources[src.id] = ss
	}
	s.publish(next, changes, false, src)
	s.mu.Unlock()
	s.runHooks()
}

// queueHook queues the OnCommit call of a publication; under mu. The
// publisher calls runHooks once it let go of mu. changes is called then,
// outside mu: it must read only what the publication froze.
func (s *Store) queueHook(prev, next *Snapshot, changes func() []Change) {
	if f := s.commitHook(); f != nil {
		s.hooks = append(s.hooks, hookCall{f: f, prev: prev, next: next, changes: changes})
	}
}

// runHooks makes the queued OnCommit calls, in order; not under mu. It
// returns once the calls queued before it was called were made, by this
// caller or by another: a hook runs while other sources publish, and a
// write still returns only once its hook has run.
func (s *Store) runHooks() {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	for {
		s.mu.Lock()
		calls := s.hooks
		s.hooks = nil
		s.mu.Unlock()
		if len(calls) == 0 {
			return
		}
		for _, c := range calls {
			c.f(c.prev, c.next, c.changes())
		}
	}
}

// publish makes next the current snapshot, with the objects of srcs as
// their writers left them; under mu and the locks of srcs. A reader of
// one index may see it before or after the snapshot as a whole; either is
// a state that a commit produced. prefer computes the preferred answers
// of the indexes with hints (a commit of one source computed its own
// before: see preferSource).
func (s *Store) publish(next *Snapshot, changes []Change, prefer bool, srcs ...*Source) {
	prev := s.current.Load()
	next.seq = prev.seq + 1
	next.writes = prev.writes
	if !next.compacted && !slices.Equal(next.indexes, prev.indexes) {
		next.writes++
	}
	// Each state carries its index's flag of this configuration (a
	// commit's copy of a state keeps it; a build or a Reconfigure sets
	// it here).
	cloned := false
	for id, is := range next.indexes {
		if served := id < len(next.conf.served) && next.conf.served[id]; is.served != served {
			if !cloned {
				next.indexes, cloned = slices.Clone(next.indexes), true // it may be prev's
			}
			c := *is
			c.served = served
			next.indexes[id] = &c
		}
	}
	if prefer {
		s.publishPreferred(prev, next)
	}
	s.publishObjects(next, srcs)
	s.current.Store(next)
	for id, is := range next.indexes {
		if h := s.heads[id]; h.Load() != is {
			h.Store(is)
		}
	}
	if len(changes) > 0 {
		s.queueHook(prev, next, func() []Change { return fallbackChanges(next.conf, changes) })
	}
}

// publishObjects puts in next the objects of each of srcs that changed
// them since the last snapshot (their set, or their indexes), frozen:
// the writer copies what it changes next. Under the locks of srcs.
func (s *Store) publishObjects(next *Snapshot, srcs []*Source) {
	cloned := false
	for _, src := range srcs {
		var was *sourceObjects
		if src.id < len(next.objects) {
			was = next.objects[src.id]
		}
		var now *sourceObjects
		switch {
		case src.removed:
		case was != nil && !src.objects.dirty && slices.Equal(was.indexes, src.indexes):
			now = was
		default:
			now = &sourceObjects{indexes: src.indexes, set: src.objects.freeze()}
		}
		if now == was {
			continue
		}
		if !cloned {
			next.objects, cloned = slices.Clone(next.objects), true
		}
		for len(next.objects) <= src.id {
			next.objects = append(next.objects, nil)
		}
		next.objects[src.id] = now
	}
}

// fallbackChanges reports the changes of a fallback or hints index as
// changes of the index it serves: what a lookup answers is the index's.
func fallbackChanges(c *config, changes []Change) []Change {
	if len(c.companionOf) == 0 {
		return changes
	}
	var out []Change
	at := map[int]int{} // index id -> its position in out
	for _, ch := range changes {
		id := ch.Index.id
		if primary, ok := c.companionOf[id]; ok {
			id = primary
		}
		i, seen := at[id]
		if !seen {
			at[id] = len(out)
			ch.Index = c.handle(ch.Index.s, id)
			out = append(out, ch)
			continue
		}
		// A relist changes many keys of both: merge through a set.
		set := make(map[string]struct{}, len(out[i].Keys))
		for _, k := range out[i].Keys {
			set[k] = struct{}{}
		}
		keys := slices.Clone(out[i].Keys)
		for _, k := range ch.Keys {
			if _, dup := set[k]; !dup {
				set[k] = struct{}{}
				keys = append(keys, k)
			}
		}
		out[i].Keys = keys
	}
	return out
}

// Seq numbers the snapshot: each commit publishes a snapshot one higher
// than the one it replaces.
func (snap *Snapshot) Seq() uint64 { return snap.seq }

// Writes counts the commits before this snapshot that changed some index
// (its keys, values or layout): not those that changed only payloads or
// nothing at all, nor Compact. A host that compacts once writes have
// quieted compares it over time.
func (snap *Snapshot) Writes() uint64 { return snap.writes }

// Snapshot returns the current snapshot. It never blocks.
func (s *Store) Snapshot() *Snapshot { return s.current.Load() }

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
