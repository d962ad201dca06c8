package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/iidp/metasync/indexer"
)

// Reader is what reads metasync: lookups, chains, keys, and the projected
// fields of objects. *Engine satisfies it, and so does the test double of
// package metasynctest, built from a config and objects without a cluster:
// write code against Reader to unit-test it.
//
// Every method may be called from any number of goroutines. A returned
// slice is shared and must not be modified. Each call reads one consistent
// state of the indexes; two calls may read two states.
type Reader interface {
	// Lookup returns the values of key in the named index: distinct,
	// sorted, nil when none or when the index is unknown.
	Lookup(index, key string) []string
	// Resolve follows the named chain from key on one state of the
	// indexes, and returns the values of its last index, distinct and
	// sorted; nil when none or when the chain is unknown.
	Resolve(chain, key string) []string
	// LookupAt and ResolveAt are Lookup and Resolve for a caller that runs
	// at a Locality: the values narrowed by the indexes' hints.
	LookupAt(index, key string, at Locality) []string
	ResolveAt(chain, key string, at Locality) []string
	// Keys returns every key of the named index, sorted; nil when the
	// index is unknown.
	Keys(index string) []string
	// Indexes describes every index, sorted by name.
	Indexes() []IndexInfo
	// Chains describes every chain, sorted by name.
	Chains() []ChainInfo
	// IndexFields returns the projected fields of the objects behind key
	// in the named index, ordered by object key, then cluster. It fails
	// when the index is unknown or its resource declares no fields.
	IndexFields(index, key string) ([]ObjectFields, error)
	// ResourceFields returns the projected fields of the named objects of
	// a resource (of all its objects when none is named), ordered by
	// object key, then cluster; an object that does not exist is left
	// out. Of a config that reads several clusters, a key names the
	// object in each cluster that has it, and "CLUSTER:namespace/name"
	// that cluster's alone (see Engine.ResourceFields). It fails when the
	// resource is unknown or declares no fields.
	ResourceFields(resource string, objectKeys ...string) ([]ObjectFields, error)
	// Subscribe follows a key, a chain key or a whole index as it changes
	// (see Engine.Subscribe).
	Subscribe(ctx context.Context, t Target) (*Subscription, error)
	// Explain reads a key or a chain key with where its values come
	// from: per step, the objects that gave them and their
	// resourceVersions (see Engine.Explain).
	Explain(t Target) Explanation
}

var _ Reader = (*Engine)(nil)

// Lookup returns the values of key in the named index: distinct, sorted,
// nil when none. The slice is shared and must not be modified. An unknown
// index yields nil; HasIndex tells the two apart. It allocates nothing.
func (e *Engine) Lookup(index, key string) []string { return e.store.Lookup(index, key) }

// LookupAt returns the values of key in the named index for a caller at
// l, by kube-proxy's rules of topology-aware routing: when the index has
// hints (the config's `hints`) and every value of the answer is hinted for
// some node (or zone), the values hinted for l's node (or else its zone),
// if there are any; otherwise every value, as Lookup. With the zero
// Locality it is Lookup. The slice is shared: do not modify it.
func (e *Engine) LookupAt(index, key string, l Locality) []string {
	if l == (Locality{}) {
		return e.Lookup(index, key)
	}
	snap := e.store.Snapshot()
	ix, ok := snap.Index(index)
	if !ok {
		return nil
	}
	return snap.LookupPreferring(ix, key, l.prefer()...)
}

// Answer reads a target once, as a lookup (KeyOf), a chain lookup
// (ChainOf) or the keys of an index (IndexOf: its keys are the Values),
// narrowed by t.At, with the answer's Synced and Stale, all of one config.
// The flags are read before the values, from a snapshot taken after them
// under the same config (a reload between the two reads again): an answer
// may say "not synced" of values read just after its resource synced,
// never "synced" of values read before, nor of an index that a reload
// has just moved to a resource not listed yet.
func (e *Inspector) Answer(t Target) Answer { return e.Answers(t)[0] }

// Answers reads each of ts as Answer reads it, all from one snapshot: one
// config and one state of the indexes. Answers of one key at several
// localities (or of several keys) read together never mix two states.
func (e *Inspector) Answers(ts ...Target) []Answer {
	out := make([]Answer, len(ts))
	for {
		v, _ := e.view()
		stale := v.stale()
		for i, t := range ts {
			out[i] = Answer{Stale: stale}
			if t.Cluster != "" {
				// That cluster's part: its own flags.
				cs, ok := v.clusterStatesOf(t)[t.Cluster]
				out[i].Synced, out[i].Stale = ok && cs.Synced, cs.Stale
				if ok {
					out[i].Clusters = map[string]ClusterState{t.Cluster: cs}
				}
				continue
			}
			if t.Chain != "" {
				out[i].Synced = v.chainSynced(t.Chain)
				if len(v.plan.Clusters) > 0 {
					out[i].Clusters = v.clusterStates(v.chains[t.Chain].indexes...)
				}
			} else {
				out[i].Synced = v.indexSynced(t.Index)
				if len(v.plan.Clusters) > 0 {
					out[i].Clusters = v.clusterStates(t.Index)
				}
			}
		}
		snap := e.store.Snapshot()
		if snap.Meta().(*view) != v {
			continue // a reload came between: read the flags again
		}
		for i, t := range ts {
			out[i].Values = v.values(snap, t)
			out[i].Seq = snap.Seq()
		}
		return out
	}
}

// values reads the values of t from snap, of v's config.
func (v *view) values(snap *indexer.Snapshot, t Target) []string {
	if t.Cluster != "" {
		if !v.hasCluster(t.Cluster) || t.All {
			return nil
		}
		values, _ := v.partOf(snap, t)
		return values
	}
	prefer := t.At.prefer()
	if t.Chain != "" {
		if ch, ok := v.chains[t.Chain]; ok {
			return snap.ResolvePreferring(ch.steps, t.Key, prefer...)
		}
		return nil
	}
	ix, ok := snap.Index(t.Index)
	switch {
	case !ok:
		return nil
	case t.All:
		return snap.Keys(ix)
	}
	return snap.LookupPreferring(ix, t.Key, prefer...)
}

// ResolveAt is Resolve for a caller at l: each step narrowed as LookupAt
// narrows it.
func (e *Engine) ResolveAt(chain, key string, l Locality) []string {
	v, snap := e.view()
	ch, ok := v.chains[chain]
	if !ok {
		return nil
	}
	return snap.ResolvePreferring(ch.steps, key, l.prefer()...)
}

// Index returns a handle on the named index, for callers that look up one
// index often: a handle's Lookup skips finding the index by name. The
// handle reads only. It reads the index as long as a reload keeps it;
// once a reload removes the index (or moves it to another resource entry)
// the handle looks up nothing: get a new one.
func (e *Inspector) Index(name string) (indexer.Index, bool) { return e.store.Index(name) }

// HasIndex reports whether the index is configured.
func (e *Inspector) HasIndex(index string) bool {
	v, _ := e.view()
	_, ok := v.byIndex[index]
	return ok
}

// HasChain reports whether the chain is configured.
func (e *Inspector) HasChain(chain string) bool {
	v, _ := e.view()
	_, ok := v.chains[chain]
	return ok
}

// IndexSynced reports whether the resource that feeds an index has
// completed a list since the engine started: until then an empty answer
// means "not known yet", not "no values". An unknown index is not synced.
func (e *Inspector) IndexSynced(index string) bool {
	v, _ := e.view()
	return v.indexSynced(index)
}

func (v *view) indexSynced(index string) bool {
	w, ok := v.byIndex[index]
	return ok && w.indexSynced(index)
}

// ChainSynced reports whether every index of a chain is synced (see
// IndexSynced); an unknown chain is not.
func (e *Inspector) ChainSynced(chain string) bool {
	v, _ := e.view()
	return v.chainSynced(chain)
}

func (v *view) chainSynced(chain string) bool {
	ch, ok := v.chains[chain]
	if !ok {
		return false
	}
	for _, index := range ch.indexes {
		if !v.indexSynced(index) {
			return false
		}
	}
	return true
}

// Resolve follows the named chain from key, on one consistent snapshot,
// and returns the distinct values of its last index, sorted; nil when none
// or the chain is unknown. The slice is the caller's.
func (e *Engine) Resolve(chain, key string) []string {
	v, snap := e.view()
	ch, ok := v.chains[chain]
	if !ok {
		return nil
	}
	return snap.Resolve(ch.steps, key)
}

// Keys returns every key of the named index, sorted. The slice is shared
// by every caller until the index changes: do not modify it.
func (e *Engine) Keys(index string) []string {
	snap := e.store.Snapshot()
	ix, ok := snap.Index(index)
	if !ok {
		return nil
	}
	return snap.Keys(ix)
}

// Indexes describes every index, sorted by name, on one snapshot.
func (e *Engine) Indexes() []IndexInfo {
	v, snap := e.view()
	out := make([]IndexInfo, 0, len(v.byIndex))
	for name, w := range v.byIndex {
		ix, _ := snap.Index(name)
		info := IndexInfo{Name: name, Resource: w.plan.Name, Keys: snap.KeyCount(ix), Synced: w.indexSynced(name), Stale: w.stale()}
		for _, pi := range w.plan.Indexes {
			if pi.Name == name && pi.Unique {
				info.Unique, info.Conflicts = true, snap.ConflictCount(ix)
			}
		}
		if n, last := w.failing(); n[name] > 0 {
			rf := last[name]
			info.Failing, info.LastRuleError = n[name], &rf
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b IndexInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Chains describes every chain, sorted by name.
func (e *Engine) Chains() []ChainInfo {
	v, _ := e.view()
	out := make([]ChainInfo, 0, len(v.chains))
	for name, ch := range v.chains {
		out = append(out, ChainInfo{Name: name, Indexes: slices.Clone(ch.indexes), Synced: v.chainSynced(name)})
	}
	slices.SortFunc(out, func(a, b ChainInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// IndexFields returns the projected fields of the objects behind key in
// the named index, ordered by object key, then cluster, on one snapshot.
func (e *Engine) IndexFields(index, key string) ([]ObjectFields, error) {
	v, snap := e.view()
	return indexFields(v, snap, index, key)
}

func indexFields(v *view, snap *indexer.Snapshot, index, key string) ([]ObjectFields, error) {
	w, ok := v.byIndex[index]
	if !ok {
		return nil, fmt.Errorf("unknown index %q", index)
	}
	if len(w.plan.Fields) == 0 {
		return nil, fmt.Errorf("resource %s of index %s declares no fields", w.plan.Name, index)
	}
	ix, _ := snap.Index(index)
	keys := snap.Objects(ix, key)
	out := make([]ObjectFields, 0, len(keys))
	for _, k := range keys {
		if p, found := snap.Payload(w.src, k); found {
			cluster, objectKey := v.splitKey(k)
			out = append(out, ObjectFields{Key: objectKey, JSON: p.(string), Cluster: cluster})
		}
	}
	if len(v.plan.Clusters) > 0 {
		slices.SortFunc(out, compareObjects) // keys apart from their clusters
	}
	return out, nil
}

// compareObjects orders objects by key, then cluster.
func compareObjects(a, b ObjectFields) int {
	if c := strings.Compare(a.Key, b.Key); c != 0 {
		return c
	}
	return strings.Compare(a.Cluster, b.Cluster)
}

// ResourceFields returns the projected fields of the named objects of a
// resource, or of all of them when none is named, ordered by object key,
// then cluster, on one snapshot. Of a plan that reads several clusters,
// an object key (namespace/name, or name) names the object in each
// cluster that has it, each answered with its Cluster; prefixed by one
// of the plan's clusters and a colon ("west:ns/name"), it names that
// cluster's alone. The keys answered are never prefixed.
func (e *Engine) ResourceFields(resource string, objectKeys ...string) ([]ObjectFields, error) {
	v, snap := e.view()
	return resourceFields(v, snap, resource, objectKeys...)
}

func resourceFields(v *view, snap *indexer.Snapshot, resource string, objectKeys ...string) ([]ObjectFields, error) {
	w, ok := v.byName[resource]
	if !ok {
		return nil, fmt.Errorf("unknown resource %q", resource)
	}
	if len(w.plan.Fields) == 0 {
		return nil, fmt.Errorf("resource %s declares no fields", resource)
	}
	var out []ObjectFields
	add := func(k string, p any) {
		cluster, objectKey := v.splitKey(k)
		out = append(out, ObjectFields{Key: objectKey, JSON: p.(string), Cluster: cluster})
	}
	if len(objectKeys) == 0 {
		out = make([]ObjectFields, 0, snap.ObjectCount(w.src))
		snap.Payloads(w.src, add)
	} else {
		for _, k := range objectKeys {
			for _, stored := range v.storedKeys(w, k) {
				if p, found := snap.Payload(w.src, stored); found {
					add(stored, p)
				}
			}
		}
	}
	slices.SortFunc(out, compareObjects)
	out = slices.CompactFunc(out, func(a, b ObjectFields) bool { return a.Key == b.Key && a.Cluster == b.Cluster })
	return out, nil
}

// AnswerIndexFields is IndexFields with its flags, read first and under
// the same config as the objects (again after a reload between them):
// never "synced" of objects read before the index synced.
func (e *Inspector) AnswerIndexFields(index, key string) (FieldsAnswer, error) {
	return e.answerFields(func(v *view) bool { return v.indexSynced(index) },
		func(v *view, snap *indexer.Snapshot) ([]ObjectFields, error) { return indexFields(v, snap, index, key) })
}

// AnswerResourceFields is ResourceFields of one object with its flags,
// read as AnswerIndexFields reads them; Synced is the resource's.
func (e *Inspector) AnswerResourceFields(resource, objectKey string) (FieldsAnswer, error) {
	return e.answerFields(func(v *view) bool {
		w := v.byName[resource]
		return w != nil && w.isSynced()
	}, func(v *view, snap *indexer.Snapshot) ([]ObjectFields, error) {
		return resourceFields(v, snap, resource, objectKey)
	})
}

func (e *Engine) answerFields(synced func(*view) bool, read func(*view, *indexer.Snapshot) ([]ObjectFields, error)) (FieldsAnswer, error) {
	for {
		v, _ := e.view()
		a := FieldsAnswer{Synced: synced(v), Stale: v.stale()}
		snap := e.store.Snapshot()
		if snap.Meta().(*view) != v {
			continue // a reload came between: read the flags again
		}
		objs, err := read(v, snap)
		a.Objects = objs
		return a, err
	}
}

// decode unmarshals each object's fields into a T.
func decode[T any](objs []ObjectFields, err error) ([]T, error) {
	if err != nil {
		return nil, err
	}
	out := make([]T, len(objs))
	for i, o := range objs {
		if err := json.Unmarshal([]byte(o.JSON), &out[i]); err != nil {
			return nil, fmt.Errorf("decode fields of %s: %w", o.Key, err)
		}
	}
	return out, nil
}

// Objects decodes into T the projected fields of every object behind key
// in the named index, ordered by object key, then cluster. T is a struct whose json tags
// name the fields (a field `name: metadata.name` gives each its name).
func Objects[T any](r Reader, index, key string) ([]T, error) {
	return decode[T](r.IndexFields(index, key))
}

// Object decodes into T the projected fields of one object of a resource,
// by object key (namespace/name, or name); found is false when there is no
// such object. Of a plan that reads several clusters, a key that names an
// object in several gives the first cluster's by name; "west:ns/name"
// names west's (see Engine.ResourceFields).
func Object[T any](r Reader, resource, objectKey string) (v T, found bool, err error) {
	objs, err := decode[T](r.ResourceFields(resource, objectKey))
	if err != nil || len(objs) == 0 {
		return v, false, err
	}
	return objs[0], true, nil
}

// List decodes into T the projected fields of every object of a resource,
// ordered by object key, then cluster.
func List[T any](r Reader, resource string) ([]T, error) {
	return decode[T](r.ResourceFields(resource))
}
