package server

import (
	"fmt"
	"net/http"
	"strings"

	msync "github.com/iidp/metasync/sync"
)

// unknownIndex answers 404 for an index that the config does not declare,
// naming those it does.
func (s *Server) unknownIndex(w http.ResponseWriter, kind, index string) {
	s.lookups.WithLabelValues(kind, "", "unknown").Inc()
	if s.engine.HasChain(index) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("unknown index %q: it is a chain: /v1/chains/%s/keys/KEY (metasync get --chain %s KEY)", index, index, index))
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("unknown index %q%s", index, known(indexNames(s.engine.Indexes()))))
}

// unknownChain answers 404 for a chain that the config does not declare,
// naming those it does, or saying that the name is an index's.
func (s *Server) unknownChain(w http.ResponseWriter, chain string) {
	if s.engine.HasIndex(chain) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("unknown chain %q: it is an index: /v1/indexes/%s/keys/KEY (metasync get %s KEY, without --chain)", chain, chain, chain))
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("unknown chain %q%s", chain, known(chainNames(s.engine.Chains()))))
}

func indexNames(infos []msync.IndexInfo) []string {
	names := make([]string, len(infos))
	for i, in := range infos {
		names[i] = in.Name
	}
	return names
}

func chainNames(infos []msync.ChainInfo) []string {
	names := make([]string, len(infos))
	for i, in := range infos {
		names[i] = in.Name
	}
	return names
}

// known lists names for an error message.
func known(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return " (known: " + strings.Join(names, ", ") + ")"
}
