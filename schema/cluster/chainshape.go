package cluster

import (
	"fmt"
	"slices"
	"strings"

	"github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/schema"
)

// Scopes says of resources whether they are namespaced, by
// "group/resource" ("/services" for the core group), as clusters'
// discovery answers: CheckClusterScopes fills it, and Advise reads it
// for a resource whose scope the config does not show.
type Scopes map[string]bool

// Advise returns what is valid but likely wrong in the plan (the
// warnings of Warnings) and notes of what it could not tell: a chain
// whose step gives the object key of a resource whose scope neither the
// config (namespace:), crds (the config's CRD files), scopes (nil
// allowed) nor the list of Kubernetes' built-ins shows, so that whether
// its values are namespace/name or bare names is not known.
func Advise(p *schema.Plan, crds []*CRD, scopes Scopes) (warnings, notes []string) {
	if p == nil {
		return nil, nil
	}
	warnings = append(hostWarnings(p), optionalOnlyWarnings(p)...)
	warnings = append(warnings, dropAfterWarnings(p)...)
	w, n := chainWarnings(p, crds, scopes)
	return append(warnings, w...), n
}

// shape is what every value of a rule looks like, where that is certain:
// joined values all hold a "/" (namespace/name), bare ones never do (a
// name, a namespace, a label's value). A joined value is never equal to
// a bare key, nor a bare value to a joined key.
type shape int

const (
	unknownShape shape = iota
	joinedShape
	bareShape
)

// chainWarnings warns of each chain step whose values and the next
// index's keys are of different shapes: the chain answers [] for every
// key. Where the step gives the object key of a resource of unknown
// scope, it notes instead what the scope decides.
func chainWarnings(p *schema.Plan, crds []*CRD, scopes Scopes) (warnings, notes []string) {
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
	for i, ch := range plan.Of(p).Chains {
		for j := 0; j+1 < len(ch.Indexes); j++ {
			from, ok1 := byName[ch.Indexes[j]]
			to, ok2 := byName[ch.Indexes[j+1]]
			if !ok1 || !ok2 {
				continue
			}
			takes := ruleShape(to.ix.Key)
			if takes == unknownShape {
				continue
			}
			at := fmt.Sprintf("chains[%d].indexes[%d]: chain %s: step %d (%s)", i, j+1, ch.Name, j+1, from.ix.Name)
			keyed := fmt.Sprintf("index %s is keyed by %s (key: %s)", to.ix.Name, shapeWords[takes], to.ix.Key.String())
			if from.ix.Value == nil {
				namespaced, why, known := scopeOf(from.r, crds, scopes)
				switch {
				case !known && takes == bareShape:
					notes = append(notes, fmt.Sprintf("%s gives the object key of %s (no value: set), namespace/name if %s is namespaced, but %s: if it is, the chain answers [] for every key; then %s. validate --cluster (or the CRD of %s under crds:) tells its scope",
						at, from.r.Name, from.r.Name, keyed, fixJoinedToBare(from.ix, to.ix), from.r.Name))
					continue
				case !known:
					continue // a bare name of a cluster-scoped resource would not fit either, but nothing says which
				case namespaced && takes == bareShape:
					warnings = append(warnings, fmt.Sprintf("%s gives namespace/name values (no value: set: the object key of %s, which %s) but %s: the chain answers [] for every key; %s",
						at, from.r.Name, why, keyed, fixJoinedToBare(from.ix, to.ix)))
				case !namespaced && takes == joinedShape:
					warnings = append(warnings, fmt.Sprintf("%s gives bare names (no value: set: the object key of %s, which %s) but %s: the chain answers [] for every key; key %s by a bare name",
						at, from.r.Name, why, keyed, to.ix.Name))
				}
				continue
			}
			switch gives := ruleShape(from.ix.Value); {
			case gives == joinedShape && takes == bareShape:
				warnings = append(warnings, fmt.Sprintf("%s gives namespace/name values (value: %s) but %s: the chain answers [] for every key; %s",
					at, from.ix.Value.String(), keyed, fixJoinedToBare(from.ix, to.ix)))
			case gives == bareShape && takes == joinedShape:
				warnings = append(warnings, fmt.Sprintf("%s gives bare names (value: %s) but %s: the chain answers [] for every key; %s",
					at, from.ix.Value.String(), keyed, fixBareToJoined(from.ix, to.ix)))
			}
		}
	}
	return warnings, notes
}

var shapeWords = map[shape]string{joinedShape: "namespace/name", bareShape: "a bare name"}

// fixJoinedToBare says what to change where from gives namespace/name
// values to an index to keyed by bare names: a bare value, or keys that
// carry the namespace too.
func fixJoinedToBare(from, to *plan.Index) string {
	return fmt.Sprintf("set value: metadata.name on %s, or key %s by namespace/name (key: '%s')",
		from.Name, to.Name, withNamespace(to.Key))
}

// fixBareToJoined says what to change where from gives bare names to an
// index to keyed by namespace/name.
func fixBareToJoined(from, to *plan.Index) string {
	fix := fmt.Sprintf("set value: '%s' on %s", withNamespace(from.Value), from.Name)
	if paths, lits := to.Key.Paths(), to.Key.Literals(); len(paths) == 2 && paths[0] == "metadata.namespace" && slices.Equal(lits, []string{"/"}) {
		return fix + fmt.Sprintf(", or key %s by a bare name (key: %s)", to.Name, paths[1])
	}
	return fix + fmt.Sprintf(", or key %s by a bare name", to.Name)
}

// withNamespace is rule r behind its object's namespace and a "/": a
// template.
func withNamespace(r *plan.Rule) string {
	if path, ok := r.SinglePath(); ok {
		return "${metadata.namespace}/${" + path + "}"
	}
	return "${metadata.namespace}/" + r.String()
}

// ruleShape is the shape of every value or key that rule r gives, where
// it is certain: joined when a literal of its template holds a "/", bare
// when every path of it gives bare names (barePath) and no literal holds
// a "/".
func ruleShape(r *plan.Rule) shape {
	if r == nil {
		return unknownShape
	}
	bare := true
	for _, lit := range r.Literals() {
		if strings.Contains(lit, "/") {
			return joinedShape
		}
	}
	for _, path := range r.Paths() {
		bare = bare && barePath(path)
	}
	if bare && len(r.Paths()) > 0 {
		return bareShape
	}
	return unknownShape
}

// barePath reports whether every value of a gjson path is without a "/":
// the apiserver refuses one in a name, a namespace and a label's value.
func barePath(path string) bool {
	segs, complete := pathSegments(path)
	if !complete || len(segs) < 2 || segs[0] != "metadata" {
		return false
	}
	switch strings.Join(segs[1:], ".") {
	case "name", "namespace", "ownerReferences.#.name":
		return true
	}
	return len(segs) == 3 && segs[1] == "labels" && segs[2] != "" && segs[2] != "#"
}

// scopeOf is whether r's objects are namespaced, where that is known,
// and how it is (the end of "the object key of R, which ..."): r has a
// namespace, its CRD is among crds, scopes has it, or it is a built-in
// of Kubernetes that this package knows.
func scopeOf(r *plan.Resource, crds []*CRD, scopes Scopes) (namespaced bool, why string, known bool) {
	gr := r.GVR.Group + "/" + r.GVR.Resource
	word := map[bool]string{true: "namespaced", false: "cluster-scoped"}
	if r.Namespace != "" {
		return true, "is namespaced (namespace: " + r.Namespace + ")", true
	}
	if crd := CRDOf(crds, r.GVR.Group, r.GVR.Resource); crd != nil {
		namespaced = crd.Spec.Scope == "Namespaced"
		return namespaced, "its CRD under crds: says is " + word[namespaced], true
	}
	if namespaced, ok := scopes[gr]; ok {
		return namespaced, "the cluster serves " + word[namespaced], true
	}
	if builtinNamespaced[gr] || builtinClusterScoped[gr] {
		return builtinNamespaced[gr], "Kubernetes serves " + word[builtinNamespaced[gr]], true
	}
	return false, "", false
}

// builtinNamespaced are Kubernetes' namespaced built-in resources that a
// config commonly watches (group/resource): their object key is
// namespace/name.
var builtinNamespaced = map[string]bool{
	"/pods": true, "/services": true, "/endpoints": true, "/configmaps": true, "/secrets": true, "/serviceaccounts": true,
	"discovery.k8s.io/endpointslices": true, "apps/deployments": true, "apps/statefulsets": true, "apps/daemonsets": true,
	"apps/replicasets": true, "batch/jobs": true, "batch/cronjobs": true, "networking.k8s.io/ingresses": true,
}

// builtinClusterScoped are Kubernetes' cluster-scoped built-in resources
// that a config may watch: their object key is the name alone.
var builtinClusterScoped = map[string]bool{
	"/nodes": true, "/namespaces": true, "/persistentvolumes": true, "storage.k8s.io/storageclasses": true,
	"networking.k8s.io/ingressclasses": true, "rbac.authorization.k8s.io/clusterroles": true,
}
