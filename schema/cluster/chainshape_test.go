package cluster

import (
	"strings"
	"testing"

	"github.com/iidp/metasync/schema"
)

// chainPlan compiles a chain of two indexes: first, of resource from,
// then second, of resource to.
func chainPlan(t *testing.T, from schema.Resource, first schema.Index, to schema.Resource, second schema.Index) *schema.Plan {
	t.Helper()
	first.Name, second.Name = "first", "second"
	from.Name, to.Name = "from", "to"
	from.Indexes, to.Indexes = []schema.Index{first}, []schema.Index{second}
	p, err := schema.Compile(&schema.Config{
		Resources: []schema.Resource{from, to},
		Chains:    []schema.Chain{{Name: "both", Indexes: []string{"first", "second"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	appmodels      = schema.Resource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}
	endpointslices = schema.Resource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}
	nodes          = schema.Resource{Version: "v1", Resource: "nodes"}
	services       = schema.Resource{Version: "v1", Resource: "services"}
)

const (
	serviceLabel     = `metadata.labels.kubernetes\.io/service-name`
	namespacedLabel  = `${metadata.namespace}/${metadata.labels.kubernetes\.io/service-name}`
	namespacedObject = `${metadata.namespace}/${metadata.name}`
)

// TestChainShapes: a chain step whose values can never be keys of the
// next index is warned of in the config's words (the chain, the step,
// the index, the rule, what to change); where a value's shape depends
// on a resource's scope that nothing shows, a note says so instead;
// where either shape is not certain, nothing is said.
func TestChainShapes(t *testing.T) {
	inMetaTest := appmodels
	inMetaTest.Namespace = "meta-test"
	cases := []struct {
		name           string
		from           schema.Resource
		first          schema.Index
		to             schema.Resource
		second         schema.Index
		scopes         Scopes
		warning, note  string // "": none; else the whole line
		wantNoWarnings bool
	}{{
		name: "object key of a namespaced entry to a label key", from: inMetaTest, first: schema.Index{Key: "spec.models"},
		to: endpointslices, second: schema.Index{Key: serviceLabel, Value: "@endpoints"},
		warning: `chains[0].indexes[1]: chain both: step 1 (first) gives namespace/name values (no value: set: the object key of from, which is namespaced (namespace: meta-test)) but index second is keyed by a bare name (key: metadata.labels.kubernetes\.io/service-name): the chain answers [] for every key; set value: metadata.name on first, or key second by namespace/name (key: '${metadata.namespace}/${metadata.labels.kubernetes\.io/service-name}')`,
	}, {
		name: "object key of an entry of unknown scope: a note", from: appmodels, first: schema.Index{Key: "spec.models"},
		to: endpointslices, second: schema.Index{Key: serviceLabel, Value: "@endpoints"},
		note: `chains[0].indexes[1]: chain both: step 1 (first) gives the object key of from (no value: set), namespace/name if from is namespaced, but index second is keyed by a bare name (key: metadata.labels.kubernetes\.io/service-name): if it is, the chain answers [] for every key; then set value: metadata.name on first, or key second by namespace/name (key: '${metadata.namespace}/${metadata.labels.kubernetes\.io/service-name}'). validate --cluster (or the CRD of from under crds:) tells its scope`,
	}, {
		name: "the cluster tells the scope", from: appmodels, first: schema.Index{Key: "spec.models"},
		to: endpointslices, second: schema.Index{Key: serviceLabel, Value: "@endpoints"},
		scopes:  Scopes{"iidp.com/appmodels": true},
		warning: `chains[0].indexes[1]: chain both: step 1 (first) gives namespace/name values (no value: set: the object key of from, which the cluster serves namespaced) but index second is keyed by a bare name (key: metadata.labels.kubernetes\.io/service-name): the chain answers [] for every key; set value: metadata.name on first, or key second by namespace/name (key: '${metadata.namespace}/${metadata.labels.kubernetes\.io/service-name}')`,
	}, {
		name: "cluster-scoped per the cluster: bare names fit", from: appmodels, first: schema.Index{Key: "spec.models"},
		to: endpointslices, second: schema.Index{Key: serviceLabel, Value: "@endpoints"},
		scopes: Scopes{"iidp.com/appmodels": false}, wantNoWarnings: true,
	}, {
		name: "the object key to namespace/name keys", from: inMetaTest, first: schema.Index{Key: "spec.models"},
		to: endpointslices, second: schema.Index{Key: namespacedLabel, Value: "@endpoints"}, wantNoWarnings: true,
	}, {
		name: "a bare name to a label key", from: appmodels, first: schema.Index{Key: "spec.models", Value: "metadata.name"},
		to: endpointslices, second: schema.Index{Key: serviceLabel, Value: "@endpoints"}, wantNoWarnings: true,
	}, {
		name: "a label's value to namespace/name keys", from: appmodels, first: schema.Index{Key: "spec.models", Value: "metadata.labels.app"},
		to: endpointslices, second: schema.Index{Key: namespacedLabel, Value: "@endpoints"},
		warning: `chains[0].indexes[1]: chain both: step 1 (first) gives bare names (value: metadata.labels.app) but index second is keyed by namespace/name (key: ${metadata.namespace}/${metadata.labels.kubernetes\.io/service-name}): the chain answers [] for every key; set value: '${metadata.namespace}/${metadata.labels.app}' on first, or key second by a bare name (key: metadata.labels.kubernetes\.io/service-name)`,
	}, {
		name: "namespace/name values to name keys", from: appmodels, first: schema.Index{Key: "spec.models", Value: namespacedObject},
		to: services, second: schema.Index{Key: "metadata.name", Value: "spec.clusterIP"},
		warning: `chains[0].indexes[1]: chain both: step 1 (first) gives namespace/name values (value: ${metadata.namespace}/${metadata.name}) but index second is keyed by a bare name (key: metadata.name): the chain answers [] for every key; set value: metadata.name on first, or key second by namespace/name (key: '${metadata.namespace}/${metadata.name}')`,
	}, {
		name: "a cluster-scoped built-in's object key to namespace/name keys", from: nodes, first: schema.Index{Key: "metadata.labels.zone"},
		to: services, second: schema.Index{Key: namespacedObject, Value: "spec.clusterIP"},
		warning: `chains[0].indexes[1]: chain both: step 1 (first) gives bare names (no value: set: the object key of from, which Kubernetes serves cluster-scoped) but index second is keyed by namespace/name (key: ${metadata.namespace}/${metadata.name}): the chain answers [] for every key; key second by a bare name`,
	}, {
		name: "values of a spec field: not certain", from: inMetaTest, first: schema.Index{Key: "spec.models", Value: "spec.app"},
		to: endpointslices, second: schema.Index{Key: serviceLabel, Value: "@endpoints"}, wantNoWarnings: true,
	}, {
		name: "keys of an annotation: not certain", from: inMetaTest, first: schema.Index{Key: "spec.models"},
		to: endpointslices, second: schema.Index{Key: `metadata.annotations.owner`, Value: "@endpoints"}, wantNoWarnings: true,
	}, {
		name: "keys past a modifier: not certain", from: inMetaTest, first: schema.Index{Key: "spec.models"},
		to: endpointslices, second: schema.Index{Key: `metadata.labels.app|@reverse`, Value: "@endpoints"}, wantNoWarnings: true,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			warnings, notes := Advise(chainPlan(t, c.from, c.first, c.to, c.second), nil, c.scopes)
			switch {
			case c.wantNoWarnings && (len(warnings) > 0 || len(notes) > 0):
				t.Fatalf("warnings %q, notes %q; want none", warnings, notes)
			case c.warning != "" && (len(warnings) != 1 || warnings[0] != c.warning || len(notes) > 0):
				t.Fatalf("warnings %q, notes %q\nwant the warning %q", warnings, notes, c.warning)
			case c.note != "" && (len(notes) != 1 || notes[0] != c.note || len(warnings) > 0):
				t.Fatalf("warnings %q, notes %q\nwant the note %q", warnings, notes, c.note)
			}
		})
	}
}

// TestChainShapeOfACRDFile: the scope of a CRD under crds: decides the
// shape of its object key, and Warnings (without scopes) says the same.
func TestChainShapeOfACRDFile(t *testing.T) {
	crds, err := ReadCRDs([]string{"../../examples/appmodel/crd.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	p := chainPlan(t, appmodels, schema.Index{Key: "spec.models"}, endpointslices, schema.Index{Key: serviceLabel, Value: "@endpoints"})
	got := Warnings(p, crds)
	if len(got) != 1 || !strings.Contains(got[0], "(no value: set: the object key of from, which its CRD under crds: says is namespaced)") {
		t.Fatalf("warnings %q", got)
	}
	if _, notes := Advise(p, crds, nil); len(notes) != 0 {
		t.Fatalf("notes %q, want none: the CRD tells the scope", notes)
	}
}
