package cluster

import (
	"strings"
	"testing"

	"github.com/iidp/metasync/schema"
)

func TestCheckPathsAgainstCRDSchemas(t *testing.T) {
	crds, err := ReadCRDs([]string{"../../examples/appmodel/crd.yaml", "../../examples/custom-crd/crd.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) != 2 {
		t.Fatalf("read %d CRDs", len(crds))
	}
	for _, f := range []string{"../../examples/appmodel/config.yaml", "../../examples/custom-crd/config.yaml"} {
		plan, err := schema.LoadPlan(f, schema.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := CheckPaths(plan, crds); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}

	plan, err := schema.Compile(&schema.Config{Resources: []schema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Fields: map[string]string{"kind": "spec.type.name", "ok": "metadata.labels.x"},
		Indexes: []schema.Index{
			{Name: "typo", Key: "spec.modelz"},
			{Name: "array", Key: "spec.models.first", Value: "${spec.version}/${spec.models.#}"},
			{Name: "query", Key: "spec.models.#(==x)"},
		},
	}, {
		Name: "gateways", Group: "net.iidp.com", Version: "v2", Resource: "gateways",
		Indexes: []schema.Index{{Name: "gw", Key: "spec.x"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	notes, err := CheckPaths(plan, crds)
	want := []string{
		`resources[0].fields.kind: spec.type.name: no field "name" at spec.type, which declares no fields in CRD appmodels.iidp.com v1`,
		`resources[0].indexes[0].key: spec.modelz: no field "modelz" at spec (fields: models, type, version) in CRD appmodels.iidp.com v1`,
		`resources[0].indexes[1].key: spec.models.first: spec.models is an array: use # for its elements (spec.models.#.first) in CRD appmodels.iidp.com v1`,
		`resources[1].version: CRD gateways.net.iidp.com has no version "v2" (versions: v1alpha1)`,
	}
	if err == nil {
		t.Fatal("no problem found")
	}
	if n := len(schema.Problems(err)); n != len(want) {
		t.Errorf("%d problems, want %d:\n%v", n, len(want), err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in:\n%v", w, err)
		}
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "checked up to a gjson query or modifier") {
		t.Errorf("notes = %q", notes)
	}
}

func TestPreserveUnknownFieldsIsANote(t *testing.T) {
	crds, err := ReadCRDs([]string{"../testdata/loose-crd.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := schema.Compile(&schema.Config{Resources: []schema.Resource{{
		Name: "loose", Group: "test.iidp.com", Version: "v1", Resource: "loosemodels",
		Indexes: []schema.Index{{Name: "m", Key: "spec.anything.goes"}, {Name: "n", Key: "status.nope"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	notes, err := CheckPaths(plan, crds)
	if err == nil || !strings.Contains(err.Error(), `resources[0].indexes[1].key: status.nope: no field "status" at the root (fields: spec)`) {
		t.Errorf("err = %v", err)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "spec keeps unknown fields (x-kubernetes-preserve-unknown-fields)") {
		t.Errorf("notes = %q", notes)
	}
}

func TestReadCRDsRejectsOtherKinds(t *testing.T) {
	_, err := ReadCRDs([]string{"../../examples/appmodel/samples.yaml", "../testdata/none.yaml"})
	if err == nil || !strings.Contains(err.Error(), "crds[0]: ../../examples/appmodel/samples.yaml: document 0 is a Namespace, not a CustomResourceDefinition") ||
		!strings.Contains(err.Error(), "crds[1]: stat ../testdata/none.yaml: no such file or directory") {
		t.Fatalf("err = %v", err)
	}
}
