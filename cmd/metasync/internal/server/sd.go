package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	gosync "sync"

	"github.com/iidp/metasync/internal/wire"
	msync "github.com/iidp/metasync/sync"
)

// The labels of a Prometheus http_sd target group.
const (
	labelChain   = "__meta_metasync_chain"
	labelIndex   = "__meta_metasync_index"
	labelKey     = "__meta_metasync_key"
	labelStale   = "__meta_metasync_stale"
	labelCluster = "__meta_metasync_cluster"
)

// sdClusters returns the clusters whose groups an answer of /v1/sd lists:
// none without clusters:, else every cluster, or the one that ?cluster=
// names. ok is false when it wrote a 400 (see clusterParam).
func (s *Server) sdClusters(w http.ResponseWriter, r *http.Request) (clusters []string, ok bool) {
	cluster, given, ok := s.clusterParam(w, r)
	switch {
	case !ok:
		return nil, false
	case given:
		return []string{cluster}, true
	}
	return s.engine.ClusterNames(), true
}

// sdTargets returns the targets of a key, one per cluster when clusters
// are given (see sdClusters).
func sdTargets(ts []msync.Target, t msync.Target, clusters []string) []msync.Target {
	if len(clusters) == 0 {
		return append(ts, t)
	}
	for _, c := range clusters {
		t.Cluster = c
		ts = append(ts, t)
	}
	return ts
}

// sdChain answers GET /v1/sd/chains/{chain}: Prometheus' http_sd format,
// one target group per key of the chain (a key of its first index) that
// has host:port values.
func (s *Server) sdChain(w http.ResponseWriter, r *http.Request) {
	chain := r.PathValue("chain")
	first := ""
	for _, c := range s.engine.Chains() {
		if c.Name == chain && len(c.Indexes) > 0 {
			first = c.Indexes[0]
		}
	}
	if first == "" {
		s.lookups.WithLabelValues("sd", "", "unknown").Inc()
		writeError(w, http.StatusNotFound, fmt.Sprintf("unknown chain %q%s", chain, known(chainNames(s.engine.Chains()))))
		return
	}
	clusters, ok := s.sdClusters(w, r)
	if !ok {
		return
	}
	route := "chains/" + chain
	if len(clusters) > 0 {
		route += "?cluster=" + strings.Join(clusters, ",")
	}
	gen := s.engine.StaleChanged()
	if s.sdCache.hit(w, s, route, chain) {
		return
	}
	ka := s.engine.Answer(msync.IndexOf(first))
	ts := make([]msync.Target, 0, len(ka.Values)*max(len(clusters), 1)+1)
	ts = append(ts, msync.ChainOf(chain, "")) // synced and stale, with no keys
	for _, k := range ka.Values {
		ts = sdTargets(ts, msync.ChainOf(chain, k), clusters)
	}
	s.writeSD(w, route, labelChain, chain, ts, s.engine.Answers(ts...), ka.Seq, gen)
}

// sdIndex answers GET /v1/sd/indexes/{index}: Prometheus' http_sd
// format, one target group per key of the index that has host:port
// values.
func (s *Server) sdIndex(w http.ResponseWriter, r *http.Request) {
	index := r.PathValue("index")
	if !s.engine.HasIndex(index) {
		s.unknownIndex(w, "sd", index)
		return
	}
	clusters, ok := s.sdClusters(w, r)
	if !ok {
		return
	}
	route := "indexes/" + index
	if len(clusters) > 0 {
		route += "?cluster=" + strings.Join(clusters, ",")
	}
	gen := s.engine.StaleChanged()
	if s.sdCache.hit(w, s, route, index) {
		return
	}
	ka := s.engine.Answer(msync.IndexOf(index))
	ts := make([]msync.Target, 0, len(ka.Values)*max(len(clusters), 1)+1)
	ts = append(ts, msync.IndexOf(index))
	for _, k := range ka.Values {
		ts = sdTargets(ts, msync.KeyOf(index, k), clusters)
	}
	s.writeSD(w, route, labelIndex, index, ts, s.engine.Answers(ts...), ka.Seq, gen)
}

// sdCache keeps the last encoded answer of each /v1/sd route, with the
// engine's state it was read from: Prometheus asks the same list every
// refresh_interval, from every replica of it, and while nothing changed
// an answer costs a map look-up instead of a read and an encoding of
// every key. Its routes are those of the config's chains and indexes.
type sdCache struct {
	mu gosync.Mutex
	m  map[string]*sdEntry
}

// sdEntry is one route's answer: the state it was read from (seq, and
// gen, open until the answers may be stale or not as before, or a
// reload), its body and what the lookup counts.
type sdEntry struct {
	seq    uint64
	gen    <-chan struct{}
	body   []byte
	result string
}

// hit answers route from the cache when its answer was read from the
// engine's current state, and reports whether it did.
func (c *sdCache) hit(w http.ResponseWriter, s *Server, route, name string) bool {
	c.mu.Lock()
	e := c.m[route]
	c.mu.Unlock()
	if e == nil {
		return false
	}
	select {
	case <-e.gen:
		return false
	default:
	}
	if s.engine.Answers(msync.Target{})[0].Seq != e.seq {
		return false
	}
	s.lookups.WithLabelValues("sd", name, e.result).Inc()
	writeBody(w, e.body)
	return true
}

func (c *sdCache) put(route string, e *sdEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*sdEntry{}
	}
	c.m[route] = e
}

// writeBody answers 200 with body, JSON encoded already.
func writeBody(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// writeSD answers the target groups of as (the answers of ts, read
// together; the first one gives synced and stale only): 503 before the
// chain or index has synced (Prometheus keeps its last list on an
// error), else 200 and a JSON array, [] when no key has a host:port
// value. The answer is kept for route when its keys (read at keysSeq)
// are of the same state as as, and no staleness change (gen) came.
func (s *Server) writeSD(w http.ResponseWriter, route, label, name string, ts []msync.Target, as []msync.Answer, keysSeq uint64, gen <-chan struct{}) {
	if !as[0].Synced {
		s.lookups.WithLabelValues("sd", name, "unsynced").Inc()
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%s %q has not completed its first list yet: no targets are known yet", label[len("__meta_metasync_"):], name))
		return
	}
	groups := make([]wire.TargetGroup, 0, len(as)-1)
	for i := 1; i < len(as); i++ {
		targets := HostPorts(as[i].Values)
		if len(targets) == 0 {
			continue
		}
		labels := map[string]string{label: name, labelKey: ts[i].Key}
		if ts[i].Cluster != "" {
			labels[labelCluster] = ts[i].Cluster
		}
		if as[i].Stale {
			labels[labelStale] = "true"
		}
		groups = append(groups, wire.TargetGroup{Targets: targets, Labels: labels})
	}
	result := "hit"
	if len(groups) == 0 {
		result = "miss"
	}
	s.lookups.WithLabelValues("sd", name, result).Inc()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(groups)
	if as[0].Seq == keysSeq {
		s.sdCache.put(route, &sdEntry{seq: keysSeq, gen: gen, body: buf.Bytes(), result: result})
	}
	writeBody(w, buf.Bytes())
}

// HostPorts returns the values that are host:port (a host, and a port
// from 1 to 65535), in their order; the others are left out of every
// facade.
func HostPorts(values []string) []string {
	out := make([]string, 0, len(values))
	for _, v := range values {
		if _, _, ok := SplitHostPort(v); ok {
			out = append(out, v)
		}
	}
	return out
}

// SplitHostPort reads a value as host:port: ok when it has a host and a
// port from 1 to 65535.
func SplitHostPort(v string) (host string, port int, ok bool) {
	h, p, err := net.SplitHostPort(v)
	if err != nil || h == "" {
		return "", 0, false
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, false
	}
	return h, int(n), true
}
