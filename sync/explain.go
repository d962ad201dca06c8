package sync

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/iidp/metasync/indexer"
)

// explainStep is the step of index explaining keys, with the index's
// flags: cluster's, when narrow.
func (v *view) explainStep(index string, keys []string, cluster string, narrow bool) ExplainStep {
	st := ExplainStep{Index: index, Keys: keys}
	w := v.byIndex[index]
	st.Synced = w != nil && w.indexSynced(index)
	st.Stale = w != nil && w.stale()
	if narrow {
		cs, ok := v.clusterStates(index)[cluster]
		st.Synced, st.Stale = ok && cs.Synced, cs.Stale
	}
	return st
}

// Explain reads a target as Answer does (a key of an index, or of a
// chain; narrowed by t.At, and by t.Cluster to that cluster's part and
// objects of the last step), and tells for each step which objects gave its
// values, with their resourceVersions, from one state of the indexes.
// Unknown index or chain: a step with ExplainUnknownIndex. An object is
// named by its key, namespace/name, and, of a plan that reads several
// clusters, by its Cluster beside it.
//
// Explain is for people: it is not on a lookup's path. It reads every
// object of each step's resource, a few milliseconds per 10,000 objects,
// from the snapshot it explains, and takes no lock: writes go on
// meanwhile, and it tells the state it started from.
func (e *Engine) Explain(t Target) Explanation {
	var out Explanation
	e.store.Explain(func(x *indexer.Explainer) {
		snap := x.Snapshot()
		v := snap.Meta().(*view)
		out.Answer.Stale = v.stale()
		var steps []indexer.Index
		var names []string
		if t.Chain != "" {
			ch, ok := v.chains[t.Chain]
			if !ok {
				out.Steps = []ExplainStep{{Index: t.Chain, Keys: []string{t.Key}, Empty: ExplainUnknownIndex}}
				return
			}
			steps, names = ch.steps, ch.indexes
			out.Answer.Synced = v.chainSynced(t.Chain)
		} else {
			ix, ok := snap.Index(t.Index)
			if !ok {
				out.Steps = []ExplainStep{{Index: t.Index, Keys: []string{t.Key}, Empty: ExplainUnknownIndex}}
				return
			}
			steps, names = []indexer.Index{ix}, []string{t.Index}
			out.Answer.Synced = v.indexSynced(t.Index)
		}
		if len(v.plan.Clusters) > 0 {
			out.Answer.Clusters = v.clusterStatesOf(t)
		}
		if t.Cluster != "" {
			cs, ok := out.Answer.Clusters[t.Cluster]
			out.Answer.Synced, out.Answer.Stale = ok && cs.Synced, cs.Stale
		}
		prefer := t.At.prefer()
		keys := []string{t.Key}
		for i, ix := range steps {
			// A cluster narrows the last step: the steps before it are
			// the whole answer's (see partOf).
			narrow := t.Cluster != "" && i == len(steps)-1
			st := v.explainStep(names[i], keys, t.Cluster, narrow)
			w := v.byIndex[names[i]]
			var values []string
			answers := make(map[string][]string, len(keys)) // what each key answers
			for _, k := range keys {
				if narrow {
					if pr, ok := v.parts[names[i]]; ok {
						answers[k] = pr.lookup(snap, k, t.Cluster, prefer)
					}
				} else {
					answers[k] = snap.LookupPreferring(ix, k, prefer...)
				}
				values = append(values, answers[k]...)
			}
			slices.Sort(values)
			st.Values = slices.Clip(slices.Compact(values))
			conflicts := map[string]bool{}
			for _, k := range snap.Conflicts(ix) {
				conflicts[k] = true
			}
			resource := ""
			if w != nil {
				resource = w.plan.Name
			}
			v.explainObjects(x, ix, &st, explainPart{t: t, narrow: narrow, resource: resource, answers: answers, conflicts: conflicts})
			if len(st.Values) == 0 {
				switch {
				case !st.Synced:
					st.Empty = ExplainNotSynced
				case st.Stale:
					st.Empty = ExplainStale
				case narrow:
					st.Empty = ExplainNotInCluster
				default:
					st.Empty = ExplainUnknownKey
				}
			}
			out.Steps = append(out.Steps, st)
			keys = st.Values
			if len(keys) == 0 {
				break
			}
		}
		if len(keys) > 0 {
			out.Answer.Values = slices.Clone(keys)
		}
	})
	return out
}

// explainPart is what explainObjects needs of the step it fills: the
// target explained, whether the step is narrowed to t.Cluster, its
// resource entry, what each key looked up answers and its keys in
// conflict.
type explainPart struct {
	t         Target
	narrow    bool
	resource  string
	answers   map[string][]string
	conflicts map[string]bool
}

// explainObjects fills st's Objects (and Conflicts) with the claimants
// of its keys in ix: each object's key and cluster apart, of the
// step's cluster alone when narrowed, with the values its key does not
// answer and why.
func (v *view) explainObjects(x *indexer.Explainer, ix indexer.Index, st *ExplainStep, p explainPart) {
	snap, t := x.Snapshot(), p.t
	claims := x.Claims(ix, st.Keys)
	for _, k := range st.Keys {
		if p.conflicts[k] {
			st.Conflicts = append(st.Conflicts, k)
		}
		// Searched once per value of each object: sorted (a key's
		// answer is), and its hints' tags by value, read once for the
		// key, so that a key of many values costs its values, not their
		// square.
		answer := p.answers[k]
		if !slices.IsSorted(answer) {
			answer = slices.Sorted(slices.Values(answer))
		}
		var tags map[string][]string
		for _, c := range claims[k] {
			cluster, key := v.splitKey(c.Object)
			if p.narrow && cluster != t.Cluster {
				continue // another cluster's: not of this part
			}
			o := ExplainedObject{Resource: p.resource, Key: key, Cluster: cluster, ResourceVersion: c.Meta.Version,
				IndexKey: k, Values: slices.Clip(slices.Compact(slices.Sorted(slices.Values(c.Values)))), Chosen: c.Chosen, Fallback: c.Fallback}
			if c.Meta.Created > 0 {
				o.Created = time.Unix(c.Meta.Created, 0).UTC()
			}
			for _, v := range o.Values {
				if _, ok := slices.BinarySearch(answer, v); !ok {
					o.Unanswered = append(o.Unanswered, v)
				}
			}
			switch {
			case len(o.Unanswered) == 0:
			case c.Shadowed:
				o.Why = ExplainShadowed
			case p.conflicts[k] && !c.Chosen:
				o.Why = ExplainYounger
			case t.At != (Locality{}):
				if tags == nil {
					tags = tagsByValue(snap.Hints(ix, k))
				}
				o.Why = ExplainElsewhere + " (" + strings.Join(t.At.prefer(), ", ") + ")" + hintedFor(tags, o.Unanswered)
			}
			st.Objects = append(st.Objects, o)
		}
	}
}

// Conflicts returns, for each unique index with keys in conflict (claimed
// with different values by several objects), those keys; sorted by index.
func (e *Inspector) Conflicts() []Conflict {
	v, snap := e.view()
	var out []Conflict
	for _, r := range v.plan.Resources {
		for _, ix := range r.Indexes {
			if !ix.Unique {
				continue
			}
			h, ok := snap.Index(ix.Name)
			if !ok || snap.ConflictCount(h) == 0 {
				continue
			}
			out = append(out, Conflict{Index: ix.Name, Keys: snap.Conflicts(h)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// noteConflict logs a conflict the store reports (under its writer lock:
// quick, and reads the view without it).
func (e *Engine) noteConflict(n indexer.ConflictNote) {
	v, snap := e.view()
	name := ""
	for index := range v.byIndex {
		if ix, ok := snap.Index(index); ok && ix == n.Index {
			name = index
			break
		}
	}
	if name == "" {
		return // a reload is making the index: its note comes again
	}
	c := &e.conflicts
	c.mu.Lock()
	now := time.Now()
	if c.last == nil {
		c.last, c.held = map[string]time.Time{}, map[string]int{}
	}
	if t, ok := c.last[name]; ok && now.Sub(t) < conflictLogEvery {
		c.held[name]++
		c.mu.Unlock()
		return
	}
	held := c.held[name]
	c.last[name], c.held[name] = now, 0
	c.mu.Unlock()
	attrs := []any{"index", name, "key", n.Key,
		"answered", n.Chosen.Object, "answeredValues", n.Chosen.Values,
		"other", n.Other.Object, "otherValues", n.Other.Values}
	if held > 0 {
		attrs = append(attrs, "moreSinceLastLine", held)
	}
	e.log.Warn("unique index: a key is claimed by several objects with different values; the oldest claimant is answered (see ?explain=true and metasync_index_conflicting_keys)", attrs...)
}

// tagsByValue reads the hints of a key ("VALUE\tKIND=NAME"): the tags of
// each value, distinct.
func tagsByValue(hints []string) map[string][]string {
	tags := map[string][]string{}
	for _, h := range hints {
		// A value may hold a tab; its tag (KIND=NAME) never does.
		i := strings.LastIndexByte(h, '\t')
		if i < 0 {
			continue
		}
		v, tag := h[:i], h[i+1:]
		if strings.Contains(tag, "=") && !slices.Contains(tags[v], tag) {
			tags[v] = append(tags[v], tag)
		}
	}
	return tags
}

// hintedFor says which tags (by value, see tagsByValue) the hints of a key
// give the values not answered (": hinted for zone=zone-b"), "" when they
// give none.
func hintedFor(tags map[string][]string, unanswered []string) string {
	var out []string
	for _, v := range unanswered {
		out = append(out, tags[v]...)
	}
	if len(out) == 0 {
		return ""
	}
	slices.Sort(out)
	return ": hinted for " + strings.Join(slices.Compact(out), ", ")
}
