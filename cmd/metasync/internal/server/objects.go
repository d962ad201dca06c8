package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/iidp/metasync/internal/wire"
	msync "github.com/iidp/metasync/sync"
)

// The routes of chains and of objects' fields (the design's "Objects and
// chains over HTTP"): what the library reads, the daemon answers too.

// listChains answers GET /v1/chains.
func (s *Server) listChains(w http.ResponseWriter, _ *http.Request) {
	ans := wire.Chains{Chains: []wire.Chain{}, Stale: s.engine.Stale()}
	for _, c := range s.engine.Chains() {
		ans.Chains = append(ans.Chains, wire.Chain{Name: c.Name, Indexes: nonNil(c.Indexes), Synced: c.Synced})
	}
	writeJSON(w, http.StatusOK, ans)
}

// chainKeys answers GET /v1/chains/{chain}/keys: a chain has no keys of
// its own; its first index's are the keys it answers.
func (s *Server) chainKeys(w http.ResponseWriter, r *http.Request) {
	chain := r.PathValue("chain")
	for _, c := range s.engine.Chains() {
		if c.Name == chain && len(c.Indexes) > 0 {
			writeError(w, http.StatusNotFound, fmt.Sprintf("a chain lists no keys of its own: chain %q answers the keys of its first index, GET /v1/indexes/%s/keys; ask one with /v1/chains/%s/keys/KEY", chain, c.Indexes[0], chain))
			return
		}
	}
	s.unknownChain(w, chain)
}

// object answers GET /v1/resources/{resource}/objects/{key}. The key is
// namespace/name (or name); of a config with clusters:, ?cluster=NAME
// names that cluster's object, and without it a key that names an
// object in several clusters answers each of them in "objects", the
// first's fields beside (by cluster name). The engine's own form,
// CLUSTER:namespace/name, is taken too.
func (s *Server) object(w http.ResponseWriter, r *http.Request) {
	resource, key := r.PathValue("resource"), r.PathValue("key")
	if !validKey(w, key) {
		return
	}
	ask, in, ok := s.objectIn(w, r, key)
	if !ok {
		return
	}
	// The flags are read before the fields, under the same config: a
	// resource that has not completed a list never answers "no such
	// object", which it does not know yet.
	a, err := s.engine.AnswerResourceFields(resource, ask)
	objs, synced, stale := a.Objects, a.Synced, a.Stale
	if err != nil {
		writeError(w, http.StatusNotFound, s.fieldsError(err))
		return
	}
	if len(objs) == 0 && !synced {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("resource %s has not completed a list yet: object %q%s is not known yet", resource, key, in))
		return
	}
	if len(objs) == 0 {
		writeError(w, http.StatusNotFound, fmt.Sprintf("resource %s has no object %q%s (an object key is namespace/name, or name when cluster-scoped)", resource, key, in))
		return
	}
	ans := wire.Object{Resource: resource, Key: objs[0].Key, Cluster: objs[0].Cluster, Fields: json.RawMessage(objs[0].JSON), Stale: stale}
	if len(objs) > 1 {
		for _, o := range objs {
			ans.Objects = append(ans.Objects, wire.ObjectFields{Key: o.Key, Cluster: o.Cluster, Fields: json.RawMessage(o.JSON)})
		}
	}
	writeJSON(w, http.StatusOK, ans)
}

// objectIn reads the cluster of an object route: the key to ask the
// engine for (CLUSTER:key with ?cluster=NAME, key as it is without) and
// the words that say in which cluster (" in cluster west", or "" when
// the key says it or names every cluster's). A key that names another
// cluster than ?cluster= is a JSON 400, as is what clusterParam refuses.
func (s *Server) objectIn(w http.ResponseWriter, r *http.Request, key string) (ask, in string, ok bool) {
	cluster, given, ok := s.clusterParam(w, r)
	names := s.engine.ClusterNames()
	prefix, rest, prefixed := strings.Cut(key, ":")
	prefixed = prefixed && slices.Contains(names, prefix) // the engine's form
	switch {
	case !ok:
		return "", "", false
	case !given:
		return key, "", true
	case prefixed && prefix != cluster:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("object key %q names cluster %s, and cluster=%s another: give one of them", key, prefix, cluster))
		return "", "", false
	case prefixed:
		key = rest
	}
	return cluster + ":" + key, " in cluster " + cluster, true
}

// indexObjects answers GET /v1/indexes/{index}/keys/{key}/objects.
func (s *Server) indexObjects(w http.ResponseWriter, r *http.Request) {
	index, key := r.PathValue("index"), r.PathValue("key")
	if !s.engine.HasIndex(index) {
		s.unknownIndex(w, "objects", index)
		return
	}
	if !validKey(w, key) {
		return
	}
	// The flags before the objects, under the same config, as
	// Inspector.Answer reads them: never "synced" of objects read before the
	// resource synced.
	a, err := s.engine.AnswerIndexFields(index, key)
	objs, synced, stale := a.Objects, a.Synced, a.Stale
	if err != nil {
		writeError(w, http.StatusNotFound, s.fieldsError(err))
		return
	}
	ans := wire.Objects{Index: index, Key: key, Objects: make([]wire.ObjectFields, 0, len(objs)), Synced: notSynced(synced), Stale: stale}
	for _, o := range objs {
		ans.Objects = append(ans.Objects, wire.ObjectFields{Key: o.Key, Cluster: o.Cluster, Fields: json.RawMessage(o.JSON)})
	}
	writeJSON(w, http.StatusOK, ans)
}

// fieldsError is the message of an engine's refusal to read fields, with
// the names a caller may use.
func (s *Server) fieldsError(err error) string {
	msg := err.Error()
	if strings.HasPrefix(msg, "unknown resource") {
		var names []string
		for _, st := range s.engine.Status() {
			names = append(names, st.Name)
		}
		msg += known(names)
	}
	if strings.Contains(msg, "declares no fields") {
		msg += ": add `fields:` to its resource entry in the config"
	}
	return msg
}

// clusters answers GET /v1/clusters: each cluster of the config, with
// its state; an empty list for a config without clusters.
func (s *Server) clusters(w http.ResponseWriter, _ *http.Request) {
	ans := wire.Clusters{Clusters: []wire.Cluster{}}
	for _, c := range s.engine.Clusters() {
		wc := wire.Cluster{Name: c.Name, Home: c.Home, Required: c.Required, Connected: c.Connected,
			Synced: c.Synced, Stale: c.Stale, Objects: c.Objects, Error: c.Error,
			KubeconfigRotations: c.KubeconfigRotations, KubeconfigErrors: c.KubeconfigErrors, KubeconfigError: c.KubeconfigError}
		if !c.LastContact.IsZero() {
			t := c.LastContact.UTC()
			wc.LastContact = &t
		}
		ans.Clusters = append(ans.Clusters, wc)
	}
	writeJSON(w, http.StatusOK, ans)
}

// wireClusters is an answer's per-cluster state as the API gives it.
func wireClusters(cs map[string]msync.ClusterState) map[string]wire.ClusterState {
	if cs == nil {
		return nil
	}
	out := make(map[string]wire.ClusterState, len(cs))
	for name, c := range cs {
		out[name] = wire.ClusterState{Synced: c.Synced, Stale: c.Stale}
	}
	return out
}

// clusterParam reads ?cluster=NAME: given reports whether the request
// has one, ok whether it names one cluster of the config, once; when it
// does not, it has written a JSON 400 that says why.
func (s *Server) clusterParam(w http.ResponseWriter, r *http.Request) (cluster string, given, ok bool) {
	vs, given := r.URL.Query()["cluster"]
	if !given {
		return "", false, true
	}
	switch names := s.engine.ClusterNames(); {
	case len(vs) != 1 || vs[0] == "":
		writeError(w, http.StatusBadRequest, "cluster: give one cluster's name once")
	case len(names) == 0:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("cluster=%s: the config reads one cluster (no clusters:)", vs[0]))
	case !slices.Contains(names, vs[0]):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown cluster %q (known: %s)", vs[0], strings.Join(names, ", ")))
	default:
		return vs[0], true, true
	}
	return "", true, false
}

// inCluster answers a lookup or chain lookup narrowed by ?cluster=NAME
// to one cluster's part, or streams it with ?watch=true, and reports
// whether it answered. The part reads as a lookup reads
// (Target.Cluster); with ?zone= or ?node=, it is narrowed by the hints
// too. With explain, it narrows *t to the cluster and leaves the answer
// to the caller's explain (which checks access and budget first).
func (s *Server) inCluster(w http.ResponseWriter, r *http.Request, t *msync.Target, explain bool) bool {
	cluster, given, ok := s.clusterParam(w, r)
	if !given {
		return false
	}
	switch {
	case !ok:
	case explain && watching(r):
		writeError(w, http.StatusBadRequest, "explain=true and watch=true: explain answers once; drop one of them")
	case explain:
		t.Cluster = cluster
		return false
	case watching(r):
		t.Cluster = cluster
		s.stream(w, r, *t)
	default:
		t.Cluster = cluster
		ans := s.engine.Answer(*t)
		values := nonNil(ans.Values)
		writeJSON(w, http.StatusOK, wire.Lookup{Index: t.Index, Chain: t.Chain, Key: t.Key, Values: &values,
			Synced: notSynced(ans.Synced), Stale: ans.Stale, Clusters: wireClusters(ans.Clusters)})
	}
	return true
}
