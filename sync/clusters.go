package sync

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/iidp/metasync/sync/internal/follow"

	"k8s.io/client-go/rest"

	compiled "github.com/iidp/metasync/internal/plan"
)

// A plan may read several clusters (schema.Cluster). Each resource entry
// then has one watcher per cluster, each with its own client, watch,
// sync state and resourceVersion, all writing one source: a watcher's
// objects are keyed "CLUSTER:namespace/name" there, and its lists
// replace only its own (indexer.Source.ReplaceWithin). What the engine
// answers of an object (Explain, the fields readers, RuleFailure) gives
// its key as namespace/name, its cluster beside it (splitKey). A lookup
// answers the union of every cluster's values, each once, and a unique
// index the oldest claimant across them (creation time, then object
// key: cluster name first). One cluster's failure never holds back
// another's writes: each watcher writes on its own.

// indexSynced reports whether the index answers from a complete list of
// every required cluster (of some cluster when none is required).
func (r *resource) indexSynced(index string) bool {
	return r.all(func(w *follow.Watcher) bool { return w.IndexSynced(index) })
}

// isSynced is indexSynced for the resource's data as a whole.
func (r *resource) isSynced() bool { return r.all((*follow.Watcher).IsSynced) }

// all reports whether f holds for every required part, or for some part
// when none is required.
func (r *resource) all(f func(*follow.Watcher) bool) bool {
	some, required := false, false
	for _, w := range r.parts {
		ok := f(w)
		some = some || ok
		if w.Required {
			required = true
			if !ok {
				return false
			}
		}
	}
	return required || some
}

// unsynced returns a part that keeps the index from being synced: a
// required one not synced, else (none required) the first.
func (r *resource) unsynced(index string) *follow.Watcher {
	for _, w := range r.parts {
		if w.Required && !w.IndexSynced(index) {
			return w
		}
	}
	return r.parts[0]
}

// stale reports whether some cluster's part may be behind its apiserver.
func (r *resource) stale() bool {
	for _, w := range r.parts {
		if w.Stale() {
			return true
		}
	}
	return false
}

// failing counts the objects whose rule fails now, per index, over every
// cluster, with the latest failure of each index.
func (r *resource) failing() (map[string]int, map[string]RuleFailure) {
	if len(r.parts) == 1 {
		n, last := r.parts[0].Failing.Counts()
		return n, r.parts[0].PublicFailures(last)
	}
	n, last := map[string]int{}, map[string]RuleFailure{}
	for _, w := range r.parts {
		wn, wl := w.Failing.Counts()
		wl = w.PublicFailures(wl)
		for k, c := range wn {
			n[k] += c
		}
		for k, f := range wl {
			if was, ok := last[k]; !ok || f.At.After(was.At) {
				last[k] = f
			}
		}
	}
	return n, last
}

// lead is the resource's first watcher: the only one without clusters.
func (r *resource) lead() *follow.Watcher { return r.parts[0] }

// Clusters returns the state of each cluster, in config order; nil for a
// plan without clusters.
func (e *Engine) Clusters() []ClusterStatus {
	v, snap := e.view()
	if v.plan == nil || len(v.plan.Clusters) == 0 {
		return nil
	}
	out := make([]ClusterStatus, len(v.plan.Clusters))
	at := map[string]int{}
	for i, c := range v.plan.Clusters {
		out[i] = ClusterStatus{Name: c.Name, Home: c.Home, Required: c.Required, Connected: true, Synced: true}
		out[i].KubeconfigRotations, out[i].KubeconfigErrors, out[i].KubeconfigError = e.conns.kubeconfigState(c.Name)
		at[c.Name] = i
	}
	watched := make([]bool, len(out))
	for _, w := range v.watchers {
		i, ok := at[w.ClusterName]
		if !ok {
			continue
		}
		watched[i] = true
		cs := &out[i]
		st := w.Status(snap, e.staleAfter)
		cs.Objects += st.Objects
		cs.Synced = cs.Synced && st.Synced
		cs.Stale = cs.Stale || w.Stale()
		if st.Error != "" && !w.Answered.Load() {
			// The last attempt failed: a list that worked since (while no
			// watch is established yet) connects the cluster again.
			cs.Connected = false
			if cs.Error == "" {
				cs.Error = st.Name + ": " + st.Error
			}
		}
		if t := w.LastContact(); t.After(cs.LastContact) {
			cs.LastContact = t
		}
	}
	for i := range out {
		// A cluster that no resource entry reads has nothing to be cut
		// off from: connected, synced, with no contact to show.
		if watched[i] && out[i].LastContact.IsZero() {
			out[i].Connected = false
		}
	}
	return out
}

// splitKey returns the cluster of an object key of v and the object's
// own key: "west:ns/name" is ("west", "ns/name"); of a plan without
// clusters, ("", key). What the engine answers gives the two apart: an
// object's key there is never prefixed by its cluster.
func (v *view) splitKey(key string) (cluster, objectKey string) {
	if v.plan == nil || len(v.plan.Clusters) == 0 {
		return "", key
	}
	cluster, objectKey, ok := strings.Cut(key, ":")
	if !ok {
		return "", key
	}
	return cluster, objectKey
}

// storedKeys returns the keys under which r holds the objects that an
// object key names: the key itself, of a plan without clusters; else
// the key in each cluster that reads r, or, when it begins with one of
// the plan's clusters and a colon ("west:ns/name", the form the engine
// keys its objects by), in that cluster alone.
func (v *view) storedKeys(r *resource, key string) []string {
	if v.plan == nil || len(v.plan.Clusters) == 0 {
		return []string{key}
	}
	if c, _, ok := strings.Cut(key, ":"); ok && v.hasCluster(c) {
		return []string{key}
	}
	out := make([]string, 0, len(r.parts))
	for _, w := range r.parts {
		out = append(out, w.KeyPrefix+key)
	}
	return out
}

// ClusterNames returns the plan's clusters, in config order; nil without.
func (e *Inspector) ClusterNames() []string {
	v, _ := e.view()
	if v.plan == nil {
		return nil
	}
	out := make([]string, len(v.plan.Clusters))
	for i, c := range v.plan.Clusters {
		out[i] = c.Name
	}
	return out
}

// ClusterStates returns the state of each cluster's part of what t reads
// (the index of a key or an index, the indexes of a chain); nil for a
// plan without clusters, or an unknown target.
func (e *Inspector) ClusterStates(t Target) map[string]ClusterState {
	v, _ := e.view()
	return v.clusterStatesOf(t)
}

// clusterStatesOf is ClusterStates in v: of t.Cluster alone when t
// names one (nil when v has no such cluster).
func (v *view) clusterStatesOf(t Target) map[string]ClusterState {
	if v.plan == nil || len(v.plan.Clusters) == 0 {
		return nil
	}
	var out map[string]ClusterState
	var before []string // a chain's steps before its last
	if t.Chain != "" {
		ch, ok := v.chains[t.Chain]
		if !ok {
			return nil
		}
		if t.Cluster != "" {
			before = ch.indexes[:len(ch.indexes)-1]
			out = v.clusterStates(ch.indexes[len(ch.indexes)-1])
		} else {
			out = v.clusterStates(ch.indexes...)
		}
	} else {
		out = v.clusterStates(t.Index)
	}
	if t.Cluster != "" {
		cs, ok := out[t.Cluster]
		if !ok {
			return nil
		}
		// A chain narrowed by its last step: its steps before are the
		// whole answer's, whose flags its own take (synced when every
		// required cluster is, stale when any is).
		if len(before) > 0 {
			all := v.clusterStates(before...)
			for _, c := range v.plan.Clusters {
				whole := all[c.Name]
				cs.Synced = cs.Synced && (whole.Synced || !c.Required)
				cs.Stale = cs.Stale || whole.Stale
			}
		}
		return map[string]ClusterState{t.Cluster: cs}
	}
	return out
}

// hasCluster reports whether v's plan reads the named cluster.
func (v *view) hasCluster(name string) bool {
	if v.plan == nil {
		return false
	}
	return slices.ContainsFunc(v.plan.Clusters, func(c compiled.Cluster) bool { return c.Name == name })
}

// unknownCluster is the error of a cluster that v's plan does not read.
func unknownCluster(v *view, name string) error {
	var names []string
	if v.plan != nil {
		for _, c := range v.plan.Clusters {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("unknown cluster %q: the config reads one cluster (no clusters:)", name)
	}
	return fmt.Errorf("unknown cluster %q (known: %s)", name, strings.Join(names, ", "))
}

// HomeCluster returns the name of the plan's home cluster: the one read
// through the engine's own connection, or the one marked home; "" for a
// plan without clusters, or without a home.
func (e *Inspector) HomeCluster() string {
	v, _ := e.view()
	if v.plan == nil {
		return ""
	}
	for _, c := range v.plan.Clusters {
		if c.Home {
			return c.Name
		}
	}
	return ""
}

// clusterStates returns the state of each cluster's part of the
// resources behind the named indexes: synced and stale per cluster; nil
// for a plan without clusters.
func (v *view) clusterStates(indexes ...string) map[string]ClusterState {
	if v.plan == nil || len(v.plan.Clusters) == 0 {
		return nil
	}
	out := make(map[string]ClusterState, len(v.plan.Clusters))
	for _, c := range v.plan.Clusters {
		out[c.Name] = ClusterState{Synced: true}
	}
	for _, index := range indexes {
		r := v.byIndex[index]
		if r == nil {
			continue
		}
		for _, w := range r.parts {
			cs := out[w.ClusterName]
			cs.Synced = cs.Synced && w.IndexSynced(index)
			cs.Stale = cs.Stale || w.Stale()
			out[w.ClusterName] = cs
		}
	}
	return out
}

// clusterConfigs returns the REST config of each cluster of p: the one
// given in code (Options.ClusterConfigs), else own for the cluster
// without a kubeconfig, else its kubeconfig file's (whose content is in
// read).
func clusterConfigs(p *compiled.Plan, own *rest.Config, given map[string]*rest.Config) (out map[string]*rest.Config, read map[string][]byte, err error) {
	out, read = map[string]*rest.Config{}, map[string][]byte{}
	for _, c := range p.Clusters {
		switch cfg, ok := given[c.Name]; {
		case ok && cfg != nil:
			out[c.Name] = cfg
		case c.Kubeconfig == "":
			out[c.Name] = own
		default:
			cfg, body, err := loadKubeconfig(c.Kubeconfig, c.Context)
			if err != nil {
				return nil, nil, fmt.Errorf("cluster %s: kubeconfig %s: %w", c.Name, c.Kubeconfig, err)
			}
			out[c.Name], read[c.Name] = cfg, body
		}
	}
	for name := range maps.Keys(given) {
		if _, ok := out[name]; !ok {
			return nil, nil, fmt.Errorf("Options.ClusterConfigs: %q is no cluster of the config", name)
		}
	}
	return out, read, nil
}

// AnswerIn is Answer narrowed to one cluster's part of a key or a chain
// key (Target.Cluster): the values that the whole answer gives and that
// come from that cluster's objects (at each step of a chain, from the
// keys the cluster's part of the step before gave), with that cluster's
// Synced and Stale. Unlike Answer with Target.Cluster, it tells an
// unknown cluster, index or chain, or a target that a cluster does not
// narrow, as an error.
func (e *Inspector) AnswerIn(t Target, cluster string) (Answer, error) {
	names := e.ClusterNames()
	if !slices.Contains(names, cluster) {
		if len(names) == 0 {
			return Answer{}, fmt.Errorf("unknown cluster %q: the config reads one cluster (no clusters:)", cluster)
		}
		return Answer{}, fmt.Errorf("unknown cluster %q (known: %s)", cluster, strings.Join(names, ", "))
	}
	if t.Key == "" && t.Chain == "" || t.Index != "" && t.Chain != "" || t.All {
		return Answer{}, errors.New("a cluster narrows a key's or a chain key's answer")
	}
	v, _ := e.view()
	if _, ok := v.chains[t.Chain]; t.Chain != "" && !ok {
		return Answer{}, fmt.Errorf("unknown chain %q", t.Chain)
	}
	if _, ok := v.parts[t.Index]; t.Chain == "" && !ok {
		return Answer{}, fmt.Errorf("unknown index %q", t.Index)
	}
	t.Cluster = cluster
	return e.Answer(t), nil
}
