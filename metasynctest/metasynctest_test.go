package metasynctest_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// appmodelConfig is examples/appmodel's config.
func appmodelConfig() string {
	return filepath.Join("..", "examples", "appmodel", "config.yaml")
}

func TestApplyDeleteReplace(t *testing.T) {
	fake, err := metasynctest.Load(appmodelConfig())
	if err != nil {
		t.Fatal(err)
	}
	if got := fake.Indexes(); len(got) != 3 || !got[0].Synced || got[0].Keys != 0 {
		t.Fatalf("a new fake: %+v, want every index synced and empty", got)
	}
	app := func(name, ns string, models ...string) string {
		ms, _ := json.Marshal(models)
		return fmt.Sprintf(`{"metadata":{"name":%q,"namespace":%q,"labels":{"iidp":"iidp"}},"spec":{"type":"t","version":"1","models":%s}}`, name, ns, ms)
	}
	// A List, JSON and YAML documents, and a comment-only document.
	err = fake.Apply("appmodels", `{"kind":"AppModelList","items":[`+app("a", "meta-test", "m1")+`,`+app("b", "meta-test", "m1", "m2")+`]}
---
# nothing
---
`+app("other-ns", "elsewhere", "m1"))
	if err != nil {
		t.Fatal(err)
	}
	// model-to-app is unique: m1, claimed by a and b (no creation time:
	// by object key), answers a's app; the other namespace is not watched.
	if got := fake.Lookup("model-to-app", "m1"); !reflect.DeepEqual(got, []string{"a"}) {
		t.Fatalf("m1 = %v, want [a]", got)
	}
	type AppModel struct {
		Name   string   `json:"name"`
		Models []string `json:"models"`
	}
	all, err := msync.List[AppModel](fake, "appmodels")
	if err != nil || len(all) != 2 || all[1].Name != "b" || !reflect.DeepEqual(all[1].Models, []string{"m1", "m2"}) {
		t.Fatalf("List = %+v, %v", all, err)
	}
	if one, found, err := msync.Object[AppModel](fake, "appmodels", "meta-test/a"); err != nil || !found || one.Name != "a" {
		t.Fatalf("Object = %+v %v %v", one, found, err)
	}
	if _, found, err := msync.Object[AppModel](fake, "appmodels", "meta-test/none"); err != nil || found {
		t.Fatalf("Object of a missing key: found %v, %v", found, err)
	}
	if err := fake.Delete("appmodels", "meta-test/a"); err != nil {
		t.Fatal(err)
	}
	if got := fake.Lookup("model-to-app", "m1"); !reflect.DeepEqual(got, []string{"b"}) {
		t.Fatalf("after a delete: %v", got)
	}
	if err := fake.Replace("appmodels", app("c", "meta-test", "m3")); err != nil {
		t.Fatal(err)
	}
	if got := fake.Keys("model-to-app"); !reflect.DeepEqual(got, []string{"m3"}) {
		t.Fatalf("after a replace: keys %v", got)
	}
	if _, err := msync.Objects[AppModel](fake, "service-to-addresses", "x"); err == nil {
		t.Error("fields of a resource that declares none: no error")
	}
}

func TestBadInput(t *testing.T) {
	fake, err := metasynctest.Load(appmodelConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ resource, manifests, want string }{
		{"nope", `{"metadata":{"name":"a"}}`, `unknown resource "nope" (known: appmodels, endpointslices)`},
		{"appmodels", `{"metadata":{}}`, "appmodels: object 0: metadata.name: required"},
		{"appmodels", "[1, 2]", "appmodels: document 1: not an object"},
		{"appmodels", "a: [", "appmodels: document 1:"},
	} {
		err := fake.Apply(c.resource, c.manifests)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Apply(%s, %q) = %v, want %q", c.resource, c.manifests, err, c.want)
		}
	}
	if _, err := metasynctest.Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing config: no error")
	}
	if _, err := os.Stat(appmodelConfig()); err != nil {
		t.Fatal(err)
	}
}

// TestApplyReportsRuleErrors: an object that a rule skips is applied as the
// engine applies it (its other indexes hold it), and the error names the
// object, the index and what the rule met.
func TestApplyReportsRuleErrors(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{Resources: []schema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Indexes: []schema.Index{
			{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"},
			{Name: "app-to-spec", Key: "metadata.name", Value: "spec"},
		},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	err = fake.Apply("appmodels", `{"metadata":{"name":"a","namespace":"ns"},"spec":{"models":["m1"]}}`)
	var re *metasynctest.RuleErrors
	if !errors.As(err, &re) || len(re.Errors) != 1 || !strings.Contains(re.Errors[0].Error(), "appmodels: object ns/a: index app-to-spec: spec is an object") {
		t.Fatalf("Apply = %v (%#v)", err, re)
	}
	if got := fake.Lookup("model-to-app", "m1"); !slices.Equal(got, []string{"ns/a"}) && !slices.Equal(got, []string{"a"}) {
		t.Errorf("the object's other index: %q", got)
	}
	if got := fake.Lookup("app-to-spec", "a"); got != nil {
		t.Errorf("the index whose rule skipped it: %q", got)
	}
	if err := fake.Replace("appmodels", `{"metadata":{"name":"a","namespace":"ns"},"spec":{"models":["m1"]}}`); !errors.As(err, &re) {
		t.Errorf("Replace = %v", err)
	}
	if err := fake.Apply("appmodels", `{"metadata":{"name":"b","namespace":"ns"},"spec":{"models":["m2"]}}`); !errors.As(err, &re) {
		t.Errorf("every object whose spec is an object is reported: %v", err)
	}
}

// TestUnsynced: a resource that New's Unsynced names answers "not synced"
// until its first Replace, as an engine's does until its first list.
func TestUnsynced(t *testing.T) {
	fake, err := metasynctest.Load(appmodelConfig(), metasynctest.Unsynced("endpointslices"))
	if err != nil {
		t.Fatal(err)
	}
	synced := func() map[string]bool {
		out := map[string]bool{}
		for _, ix := range fake.Indexes() {
			out[ix.Name] = ix.Synced
		}
		return out
	}
	if s := synced(); !s["model-to-app"] || s["service-to-addresses"] {
		t.Fatalf("before the first list: %v", s)
	}
	if a := fake.Answer(msync.ChainOf("model-to-addresses", "model1")); a.Synced {
		t.Errorf("a chain through an unsynced resource: %+v", a)
	}
	if err := fake.Replace("endpointslices", ""); err != nil {
		t.Fatal(err)
	}
	if s := synced(); !s["service-to-addresses"] {
		t.Errorf("after the first Replace: %v", s)
	}
	if a := fake.Answer(msync.ChainOf("model-to-addresses", "model1")); !a.Synced || a.Values != nil {
		t.Errorf("after it: %+v", a)
	}
	if _, err := metasynctest.Load(appmodelConfig(), metasynctest.Unsynced("nope")); err == nil || !strings.Contains(err.Error(), `unknown resource "nope"`) {
		t.Errorf("an unknown resource: %v", err)
	}
}

// TestRuleErrorsOncePerIndex: a key rule shared by an index, its fallback
// and its hints is reported once; a failing hints rule is named as such.
func TestRuleErrorsOncePerIndex(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{Resources: []schema.Resource{{
		Name: "endpointslices", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices",
		Indexes: []schema.Index{{
			Name: "svc", Key: "metadata.labels.svc",
			Value: "@endpoints", Fallback: `@endpoints:{"terminating":true}`, Hints: "metadata.annotations",
		}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	var re *metasynctest.RuleErrors
	err = fake.Apply("endpointslices", `{"metadata":{"name":"b","namespace":"ns","labels":{"svc":{"x":1}}}}`)
	if !errors.As(err, &re) || len(re.Errors) != 1 || !strings.Contains(re.Errors[0].Error(), "index svc: metadata.labels.svc is an object") {
		t.Errorf("a bad key: %v", err)
	}
	err = fake.Apply("endpointslices", `{"metadata":{"name":"c","namespace":"ns","labels":{"svc":"s"},"annotations":{"a":"b"}},"endpoints":[{"addresses":["10.0.0.1"]}]}`)
	if !errors.As(err, &re) || len(re.Errors) != 1 || !strings.Contains(re.Errors[0].Error(), "index svc (its hints): metadata.annotations is an object") {
		t.Errorf("a bad hints rule: %v", err)
	}
	if got := fake.Lookup("svc", "s"); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Errorf("the index keeps its values: %q", got)
	}
}
