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
// (namespace/name) to an index keyed by another (metadata.name), which
// answers [] for every key; an index that answers HOST:PORT values whose
// host may be a name (see hostWarnings); a resource entry that only
// optional clusters watch (see optionalOnlyWarnings). crds are the CRD files' definitions (for the
// scope of a resource whose value is its object key); nil is allowed.
func Warnings(p *schema.Plan, crds []*CRD) []string {
	if p == nil {
		return nil
	}
	type step struct {
		ix *plan.Index
		r  *plan.Resource
	}
	byName := map[string]step{}
	for _, r := range plan.Of(p).Resources {
		for i := range r.Indexes {
			if ix := &r.Indexes[i]; !ix.Hidden() {
				byName[ix.Name] = step{ix, r}
			}
		}
	}
	out := append(hostWarnings(p), optionalOnlyWarnings(p)...)
	out = append(out, dropAfterWarnings(p)...)
	for i, ch := range plan.Of(p).Chains {
		for j := 0; j+1 < len(ch.Indexes); j++ {
			from, ok1 := byName[ch.Indexes[j]]
			to, ok2 := byName[ch.Indexes[j+1]]
			if !ok1 || !ok2 {
				continue
			}
			gives, givesWhat := valueShape(from.ix, from.r, crds)
			takes, takesWhat := keyShape(to.ix)
			if gives == "" || takes == "" || gives == takes {
				continue
			}
			out = append(out, fmt.Sprintf("chains[%d].indexes[%d]: %s gives values like %s (%s), but %s is keyed by %s (%s): the chain would answer [] for every key; make the two agree",
				i, j+1, from.ix.Name, shapeWord[gives], givesWhat, to.ix.Name, shapeWord[takes], takesWhat))
		}
	}
	return out
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

var shapeWord = map[string]string{"joined": "namespace/name", "name": "a name"}

// valueShape is the shape of an index's values: "joined" (namespace/name),
// "name", or "" when the rule does not show it.
func valueShape(ix *plan.Index, r *plan.Resource, crds []*CRD) (shape, why string) {
	if ix.Value == nil {
		namespaced := r.Namespace != "" || builtinNamespaced[r.GVR.Group+"/"+r.GVR.Resource]
		if crd := CRDOf(crds, r.GVR.Group, r.GVR.Resource); crd != nil {
			namespaced = crd.Spec.Scope == "Namespaced"
		}
		if namespaced {
			return "joined", "no value rule: the object key, namespace/name"
		}
		return "", ""
	}
	return ruleShape(ix.Value, "value")
}

// keyShape is the shape of an index's keys, as valueShape.
func keyShape(ix *plan.Index) (shape, why string) { return ruleShape(ix.Key, "key") }

func ruleShape(r *plan.Rule, what string) (shape, why string) {
	if path, ok := r.SinglePath(); ok && path == "metadata.name" {
		return "name", what + ": metadata.name"
	}
	if r.Joins("/") {
		return "joined", fmt.Sprintf("%s: %s", what, r.String())
	}
	return "", ""
}

// builtinNamespaced are Kubernetes' namespaced built-in resources that a
// config commonly watches (group/resource): their object key is
// namespace/name.
var builtinNamespaced = map[string]bool{
	"/pods": true, "/services": true, "/endpoints": true, "/configmaps": true, "/secrets": true, "/serviceaccounts": true,
	"discovery.k8s.io/endpointslices": true, "apps/deployments": true, "apps/statefulsets": true, "apps/daemonsets": true,
	"apps/replicasets": true, "batch/jobs": true, "batch/cronjobs": true, "networking.k8s.io/ingresses": true,
}
