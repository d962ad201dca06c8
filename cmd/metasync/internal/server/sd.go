package server

import (
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/iidp/metasync/internal/wire"
	msync "github.com/iidp/metasync/sync"
)

// The labels of a Prometheus http_sd target group.
const (
	labelChain = "__meta_metasync_chain"
	labelIndex = "__meta_metasync_index"
	labelKey   = "__meta_metasync_key"
	labelStale = "__meta_metasync_stale"
)

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
	keys := s.engine.Answer(msync.IndexOf(first)).Values
	ts := make([]msync.Target, 0, len(keys)+1)
	ts = append(ts, msync.ChainOf(chain, "")) // synced and stale, with no keys
	for _, k := range keys {
		ts = append(ts, msync.ChainOf(chain, k))
	}
	s.writeSD(w, labelChain, chain, ts, s.engine.Answers(ts...))
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
	keys := s.engine.Answer(msync.IndexOf(index)).Values
	ts := make([]msync.Target, 0, len(keys)+1)
	ts = append(ts, msync.IndexOf(index))
	for _, k := range keys {
		ts = append(ts, msync.KeyOf(index, k))
	}
	s.writeSD(w, labelIndex, index, ts, s.engine.Answers(ts...))
}

// writeSD answers the target groups of as (the answers of ts, read
// together; the first one gives synced and stale only): 503 before the
// chain or index has synced (Prometheus keeps its last list on an
// error), else 200 and a JSON array, [] when no key has a host:port
// value.
func (s *Server) writeSD(w http.ResponseWriter, label, name string, ts []msync.Target, as []msync.Answer) {
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
	writeJSON(w, http.StatusOK, groups)
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
