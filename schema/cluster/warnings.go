package cluster

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/schema"
)

// Warnings returns what is valid but likely wrong in the plan, one line
// each, with its field path: a chain whose step gives values of one shape
// (namespace/name) to an index keyed by another (a bare name: a name, a
// label), which answers [] for every key (see chainWarnings); an index
// that answers HOST:PORT values whose host may be a name (see
// hostWarnings); a resource entry that only optional clusters watch (see
// optionalOnlyWarnings); a dropAfter shorter than --stale-after's
// default. crds are the CRD files' definitions (for the scope of a
// resource whose value is its object key); nil is allowed. Advise also
// takes the scopes a cluster tells, and says what it could not tell.
func Warnings(p *schema.Plan, crds []*CRD) []string {
	w, _ := Advise(p, crds, nil)
	return w
}

// optionalOnlyWarnings warns of each resource entry that only clusters
// with required: false watch: no required cluster holds its answers
// back, so they count as synced once one of those clusters has listed
// (an answer of none then means "none there", or "not listed yet" of the
// others), and /readyz does not wait for it at all.
func optionalOnlyWarnings(p *schema.Plan) []string {
	required := map[string]bool{}
	for _, c := range plan.Of(p).Clusters {
		required[c.Name] = c.Required
	}
	var out []string
	for i, r := range plan.Of(p).Resources {
		if len(plan.Of(p).Clusters) == 0 || slices.ContainsFunc(plan.Of(p).ClustersOf(r), func(c string) bool { return required[c] }) {
			continue
		}
		out = append(out, fmt.Sprintf("resources[%d].clusters: %s is watched only in clusters with required: false: its answers count as synced once one of them has listed, and /readyz does not wait for it", i, r.Name))
	}
	return out
}

// dropAfterWarnings warns of each cluster whose dropAfter is shorter than
// serve's default --stale-after (30 s): its part would leave the answers
// at about the first failed request, before it is even marked stale.
func dropAfterWarnings(p *schema.Plan) []string {
	var out []string
	for i, c := range plan.Of(p).Clusters {
		if c.DropAfter > 0 && c.DropAfter < 30*time.Second {
			out = append(out, fmt.Sprintf("clusters[%d].dropAfter: %v is shorter than --stale-after's default of 30s: the cluster's part would leave the answers at about its first failed request; give it minutes", i, c.DropAfter))
		}
	}
	return out
}

// ipFields are the fields of Kubernetes' objects that hold IP addresses.
var ipFields = map[string]bool{
	"status.podIP": true, "status.podIPs.#.ip": true, "status.hostIP": true, "status.hostIPs.#.ip": true,
	"spec.clusterIP": true, "spec.clusterIPs": true, "status.loadBalancer.ingress.#.ip": true,
}

// hostWarnings warns of each index whose value is a HOST:PORT template
// whose host is not a known IP field: over xDS such values are endpoint
// addresses, and grpc-java's xDS client rejects a whole assignment that
// holds one hostname. @endpoints answers IP addresses only (it gives
// nothing of a slice of addressType FQDN).
func hostWarnings(p *schema.Plan) []string {
	var out []string
	for i, r := range plan.Of(p).Resources {
		for j := range r.Indexes {
			ix := &r.Indexes[j]
			if ix.Hidden() || ix.Value == nil {
				continue
			}
			host, ok := ix.Value.HostPath()
			if !ok || ipFields[host] {
				continue
			}
			served := []string{"indexes/" + ix.Name}
			for _, ch := range plan.Of(p).Chains {
				if len(ch.Indexes) > 0 && ch.Indexes[len(ch.Indexes)-1] == ix.Name {
					served = append(served, "chains/"+ch.Name)
				}
			}
			out = append(out, fmt.Sprintf("resources[%d].indexes[%d]: %s answers HOST:PORT values (value: %s) whose host, %s, may be a hostname: over xDS (%s) grpc-java rejects a whole assignment that holds one hostname, as it takes IP addresses only; answer IP addresses (as @endpoints does) where Java clients follow it",
				i, j, ix.Name, ix.Value.String(), host, strings.Join(served, ", ")))
		}
	}
	return out
}
