package sync

import (
	"slices"
	"strings"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
)

// Which cluster gives each value, on a read's path.
//
// Of a plan that reads several clusters, each index (and fallback) of a
// resource has a hidden companion, its parts index (partsName): under
// each key of the index, "CLUSTER\tVALUE" for every value that some
// object of CLUSTER gives the key. The watchers write it with the index,
// from the same entries, so that it is always the index's own state.
// A cluster's part of a key is then one lookup in the parts index and a
// binary search for the cluster's run of values (they sort together);
// when the cluster gives every value of the key, the answer's own slice
// is answered, and nothing is allocated. A change of one cluster's part
// is a change of the parts index's key even when the union stays the
// same: a subscription narrowed to a cluster registers there, and hears
// of it. A plan without clusters has no parts index: its reads and
// writes are the same as ever.

// partsName is the name of the parts index of the index named index: a
// name that no index of a config can have.
func partsName(index string) string { return index + "/clusters" }

// partIndexes returns the positions, among r's indexes, of those that
// have a parts index (every one but hints), in order: the parts indexes
// follow r's indexes in its source, in this order.
func partIndexes(r *compiled.Resource) []int {
	var out []int
	for i, ix := range r.Indexes {
		if ix.HintsOf == "" {
			out = append(out, i)
		}
	}
	return out
}

// tagParts appends to entries, which holds one slice per index of the
// watcher's resource, those of the parts indexes: each value of an index
// with a parts index, preceded by the watcher's cluster and a tab.
func (w *watcher) tagParts(entries [][]indexer.Entry) [][]indexer.Entry {
	for _, i := range w.partsAt {
		es := entries[i]
		if len(es) == 0 {
			entries = append(entries, nil)
			continue
		}
		tagged := make([]indexer.Entry, len(es))
		for j, e := range es {
			tagged[j] = indexer.Entry{Key: e.Key, Value: w.clusterName + "\t" + e.Value}
		}
		entries = append(entries, tagged)
	}
	return entries
}

// partRead is what reads one index's cluster parts in a view.
type partRead struct {
	ix, parts indexer.Index
	// fallback is the parts index of the index's fallback; hasFallback
	// when it has one.
	fallback    indexer.Index
	hasFallback bool
	unique      bool
}

// partReads returns how to read the cluster parts of each index of
// plan in snap's store, by index name; nil without clusters.
func partReads(plan *compiled.Plan, snap *indexer.Snapshot) map[string]partRead {
	if len(plan.Clusters) == 0 {
		return nil
	}
	out := map[string]partRead{}
	for _, r := range plan.Resources {
		for _, ix := range r.Indexes {
			if ix.Hidden() {
				continue
			}
			pr := partRead{unique: ix.Unique}
			pr.ix, _ = snap.Index(ix.Name)
			pr.parts, _ = snap.Index(partsName(ix.Name))
			if ix.Fallback != "" {
				pr.fallback, pr.hasFallback = snap.Index(partsName(ix.Fallback))
			}
			out[ix.Name] = pr
		}
	}
	return out
}

// indexes are those a subscription to a key of the index registers on:
// a change of any may change a cluster's part.
func (pr partRead) indexes() []indexer.Index {
	out := []indexer.Index{pr.ix, pr.parts}
	if pr.hasFallback {
		out = append(out, pr.fallback)
	}
	return out
}

// lookup returns the values of key that cluster's objects give, of the
// answer that a lookup gives (those of the fallback when the index has
// none of its own), narrowed by prefer as LookupPreferring narrows: to
// the preferred values of the cluster's part when some are, else the
// whole part. Distinct and sorted; shared when it is the whole answer.
func (pr partRead) lookup(snap *indexer.Snapshot, key, cluster string, prefer []string) []string {
	values := snap.Lookup(pr.ix, key)
	if len(values) == 0 {
		return nil
	}
	tagged := snap.Lookup(pr.parts, key)
	if len(tagged) == 0 && pr.hasFallback {
		tagged = snap.Lookup(pr.fallback, key)
	}
	part := runOf(tagged, cluster, values)
	if pr.unique && len(part) > 0 {
		// A unique key answers one claimant's values: the cluster's
		// part is what of those its objects give. (When part is values
		// itself, nothing is deleted, and the shared slice is kept.)
		part = slices.DeleteFunc(part, func(v string) bool {
			_, ok := slices.BinarySearch(values, v)
			return !ok
		})
	}
	if len(prefer) == 0 || len(part) == 0 {
		return part
	}
	near := snap.LookupPreferring(pr.ix, key, prefer...)
	if len(near) == len(values) {
		return part // no hint applies: every value
	}
	var both []string
	for _, v := range part {
		if _, ok := slices.BinarySearch(near, v); ok {
			both = append(both, v)
		}
	}
	if len(both) == 0 {
		return part
	}
	return both
}

// runOf returns the values of tagged ("CLUSTER\tVALUE", sorted) of
// cluster, without the tag: values itself when the run is values.
func runOf(tagged []string, cluster string, values []string) []string {
	from, _ := slices.BinarySearchFunc(tagged, cluster, func(t, c string) int {
		name, _, _ := strings.Cut(t, "\t")
		return strings.Compare(name, c)
	})
	to := from
	for to < len(tagged) && len(tagged[to]) > len(cluster) && tagged[to][len(cluster)] == '\t' && strings.HasPrefix(tagged[to], cluster) {
		to++
	}
	if to == from {
		return nil
	}
	if to-from == len(values) && sameRun(tagged[from:to], len(cluster)+1, values) {
		return values
	}
	out := make([]string, to-from)
	for i := range out {
		out[i] = tagged[from+i][len(cluster)+1:]
	}
	return out
}

// sameRun reports whether run, each without its first skip bytes, is
// values. Of most indexes a run as long as the answer is the answer, but
// not of a unique one: there the answer is one claimant's values, and
// another cluster may give as many others.
func sameRun(run []string, skip int, values []string) bool {
	for i, t := range run {
		if t[skip:] != values[i] {
			return false
		}
	}
	return true
}

// partOf reads t's values (a key or a chain key) of t.Cluster's part
// from snap: at each step of a chain, the values that the cluster's
// objects give the keys its part of the step before gave. It returns the
// indexes and keys read, for a subscription to register on.
func (v *view) partOf(snap *indexer.Snapshot, t Target) ([]string, map[indexer.Index]map[string]struct{}) {
	prefer := t.At.prefer()
	path := map[indexer.Index]map[string]struct{}{}
	names := []string{t.Index}
	if t.Chain != "" {
		names = v.chains[t.Chain].indexes
	}
	keys := []string{t.Key}
	for _, name := range names {
		pr, ok := v.parts[name]
		if !ok {
			return nil, path
		}
		for _, ix := range pr.indexes() {
			set := path[ix]
			if set == nil {
				set = map[string]struct{}{}
				path[ix] = set
			}
			for _, k := range keys {
				set[k] = struct{}{}
			}
		}
		if len(names) == 1 {
			return pr.lookup(snap, t.Key, t.Cluster, prefer), path
		}
		var next []string
		for _, k := range keys {
			next = append(next, pr.lookup(snap, k, t.Cluster, prefer)...)
		}
		slices.Sort(next)
		keys = slices.Compact(next)
	}
	if len(keys) == 0 {
		return nil, path
	}
	return slices.Clip(keys), path
}
