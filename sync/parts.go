package sync

import (
	"slices"
	"strings"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
)

// Which cluster gives each value, on a read's path.
//
// Of a plan that reads several clusters, each object key begins with its
// cluster's name and a colon, and each source keeps the object keys
// behind each index key (SourceSpec.Objects and Parts): a cluster's part
// of a key is read from those (indexer.Snapshot.Part). When every object
// behind the key is of the cluster, the answer's own slice is its part,
// and when none is, nothing: one lookup more, nothing allocated. Only a
// key that several clusters give reads the cluster's objects behind it.
// Its source tells a change of who gives a key even when the union stays
// the same: a subscription narrowed to a cluster hears of it. A plan
// without clusters keeps no more than before: its reads and writes are
// the same as ever.

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
			var pr partRead
			pr.ix, _ = snap.Index(ix.Name)
			if ix.Fallback != "" {
				pr.fallback, pr.hasFallback = snap.Index(ix.Fallback)
			}
			out[ix.Name] = pr
		}
	}
	return out
}

// indexes are those a subscription to a key of the index registers on:
// a change of any may change a cluster's part.
func (pr partRead) indexes() []indexer.Index {
	if pr.hasFallback {
		return []indexer.Index{pr.ix, pr.fallback}
	}
	return []indexer.Index{pr.ix}
}

// lookup returns the values of key that cluster's objects give, of the
// answer that a lookup gives (those of the fallback when the index has
// none of its own; of a unique key, the chosen claimant's), narrowed by
// prefer as LookupPreferring narrows: to the preferred values of the
// cluster's part when some are, else the whole part. Distinct and sorted;
// shared when it is the whole answer.
func (pr partRead) lookup(snap *indexer.Snapshot, key, cluster string, prefer []string) []string {
	prefix := cluster + ":"
	part := snap.Part(pr.ix, key, func(object string) bool { return strings.HasPrefix(object, prefix) })
	if len(prefer) == 0 || len(part) == 0 {
		return part
	}
	// Tag by tag, in prefer's order: the first that picks some of the
	// part's values narrows it (a node's endpoints may all be another
	// cluster's: then the zone's may still narrow this part).
	values := snap.Lookup(pr.ix, key)
	for _, tag := range prefer {
		near := snap.LookupPreferring(pr.ix, key, tag)
		if len(near) == len(values) {
			continue // the tag does not apply: every value
		}
		var both []string
		for _, v := range part {
			if _, ok := slices.BinarySearch(near, v); ok {
				both = append(both, v)
			}
		}
		if len(both) > 0 {
			return both
		}
	}
	return part
}

// partOf reads t's values (a key or a chain key) of t.Cluster's part
// from snap. A chain is narrowed by its last step: the steps before it
// are the whole answer's (a platform keeps its AppModels in one cluster
// and its workloads in several: west's part of "model → endpoints" is
// west's endpoints of the app that any cluster names), and the last
// gives the values that the cluster's objects give. It returns the
// indexes and keys read, for a subscription to register on.
func (v *view) partOf(snap *indexer.Snapshot, t Target) ([]string, map[indexer.Index]map[string]struct{}) {
	prefer := t.At.prefer()
	path := map[indexer.Index]map[string]struct{}{}
	names := []string{t.Index}
	var steps []indexer.Index
	if t.Chain != "" {
		ch, ok := v.chains[t.Chain]
		if !ok {
			return nil, path // no chain of that name: no answer
		}
		names, steps = ch.indexes, ch.steps
	}
	keys := []string{t.Key}
	for i, name := range names {
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
			if i < len(names)-1 {
				next = append(next, snap.LookupPreferring(steps[i], k, prefer...)...) // the whole answer's
			} else {
				next = append(next, pr.lookup(snap, k, t.Cluster, prefer)...)
			}
		}
		slices.Sort(next)
		keys = slices.Compact(next)
	}
	if len(keys) == 0 {
		return nil, path
	}
	return slices.Clip(keys), path
}
