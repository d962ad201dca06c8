package server

import (
	"fmt"
	"net/http"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	msync "github.com/iidp/metasync/sync"
)

// validKey answers 400 with a JSON error, and returns false, when a key
// sent in a request's path is not valid UTF-8. An answer is JSON, which
// holds text only: such a key would be echoed with U+FFFD in place of its
// invalid bytes, and the answer would name another key (the one holding
// U+FFFD), whose values it does not carry. Every route that takes a key
// checks it before it answers or streams. The keys an index holds need no
// check: they are read from the apiserver's JSON, which is UTF-8.
func validKey(w http.ResponseWriter, key string) bool {
	if utf8.ValidString(key) {
		return true
	}
	at := 0
	for at < len(key) {
		r, n := utf8.DecodeRuneInString(key[at:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		at += n
	}
	writeError(w, http.StatusBadRequest, fmt.Sprintf("key %+q is not valid UTF-8 (byte %d): keys are text; percent-encode the key's UTF-8 bytes", key, at))
	return false
}

// locality reads where the caller runs from ?zone= and ?node=, for
// topology-aware answers, or answers 400 naming the parameter: each is a
// label value (a zone, topology.kubernetes.io/zone) or a node name.
func locality(w http.ResponseWriter, r *http.Request) (msync.Locality, bool) {
	q := r.URL.Query()
	l := msync.Locality{Zone: q.Get("zone"), Node: q.Get("node")}
	if l.Zone != "" {
		if msgs := validation.IsValidLabelValue(l.Zone); len(msgs) > 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("zone %q: %s", l.Zone, msgs[0]))
			return l, false
		}
	}
	if l.Node != "" {
		if msgs := validation.IsDNS1123Subdomain(l.Node); len(msgs) > 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("node %q: %s", l.Node, msgs[0]))
			return l, false
		}
	}
	return l, true
}
