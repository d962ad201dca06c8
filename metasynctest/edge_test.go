package metasynctest_test

import (
	"fmt"
	"reflect"
	"strings"
	gosync "sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/metasynctest"
	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// TestApplyIsAllOrNothing guards Apply of several objects: when one of
// them is bad, none is applied and what was there stays; when all are
// good, a concurrent reader sees them all at once, never some of them.
func TestApplyIsAllOrNothing(t *testing.T) {
	fake, err := metasynctest.Load(appmodelConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.Apply("appmodels", `{metadata: {name: a, namespace: meta-test, labels: {iidp: iidp}}, spec: {models: [m0]}}`); err != nil {
		t.Fatal(err)
	}
	err = fake.Apply("appmodels", `
kind: AppModelList
items:
- metadata: {name: a, namespace: meta-test, labels: {iidp: iidp}}
  spec: {models: [m1]}
- metadata: {name: b, namespace: meta-test, labels: {iidp: iidp}}
  spec: {models: [m1]}
- metadata: {namespace: meta-test}
`)
	if err == nil || !strings.Contains(err.Error(), "object 2: metadata.name: required") {
		t.Fatalf("Apply with a nameless object: %v, want object 2's error", err)
	}
	if got := fake.Lookup("model-to-app", "m1"); len(got) != 0 {
		t.Fatalf("a failed Apply left m1 = %v", got)
	}
	if got := fake.Lookup("model-to-app", "m0"); !reflect.DeepEqual(got, []string{"a"}) {
		t.Fatalf("a failed Apply changed m0 to %v, want [a]", got)
	}

	// Two objects applied, then deleted, together, while a reader looks.
	both := `
metadata: {name: a, namespace: meta-test, labels: {iidp: iidp}}
spec: {models: [m1]}
---
metadata: {name: b, namespace: meta-test, labels: {iidp: iidp}}
spec: {models: [m1]}
`
	if err = fake.Delete("appmodels", "meta-test/a"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg gosync.WaitGroup
	var partial int
	var first string
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			// model-to-app is unique: both answer a (the smaller object
			// key, neither has a creation time); b alone is a part.
			if got := fake.Lookup("model-to-app", "m1"); len(got) != 0 && !reflect.DeepEqual(got, []string{"a"}) {
				if partial++; partial == 1 {
					first = fmt.Sprint(got)
				}
			}
		}
	})
	for i := 0; i < 200 && err == nil; i++ {
		if err = fake.Apply("appmodels", both); err == nil {
			err = fake.Delete("appmodels", "meta-test/a", "meta-test/b")
		}
	}
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if partial > 0 {
		t.Fatalf("a reader saw part of an Apply or Delete %d times, first m1 = %s", partial, first)
	}
}

// TestMissingNamespaceIsAnError guards an object without a namespace given
// to a resource entry that watches one namespace: it is an error naming
// the field, not an object silently left out.
func TestMissingNamespaceIsAnError(t *testing.T) {
	fake, err := metasynctest.Load(appmodelConfig())
	if err != nil {
		t.Fatal(err)
	}
	err = fake.Apply("appmodels", `{metadata: {name: b, labels: {iidp: iidp}}, spec: {models: [m2]}}`)
	if err == nil || !strings.Contains(err.Error(), "metadata.namespace: required") {
		t.Fatalf("Apply without a namespace: %v, want metadata.namespace: required", err)
	}
	if got := fake.Lookup("model-to-app", "m2"); len(got) != 0 {
		t.Fatalf("m2 = %v after the failed Apply", got)
	}
	// In another namespace, it is not seen, as the apiserver would not
	// send it: no error.
	if err := fake.Apply("appmodels", `{metadata: {name: b, namespace: elsewhere, labels: {iidp: iidp}}, spec: {models: [m2]}}`); err != nil {
		t.Fatal(err)
	}
	if got := fake.Lookup("model-to-app", "m2"); len(got) != 0 {
		t.Fatalf("m2 = %v from another namespace", got)
	}
}

// TestZeroPlanIsAnError guards a schema.Plan that was not built by
// schema.Compile or schema.LoadPlan: metasynctest.New and sync.New say so
// with an error rather than a panic.
func TestZeroPlanIsAnError(t *testing.T) {
	for name, build := range map[string]func() error{
		"metasynctest.New": func() error { _, err := metasynctest.New(&mschema.Plan{}); return err },
		"sync.New": func() error {
			_, err := msync.New(&mschema.Plan{}, &rest.Config{Host: "http://127.0.0.1:1"}, msync.Options{})
			return err
		},
	} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s of a zero Plan panicked: %v", name, p)
				}
			}()
			if err := build(); err == nil {
				t.Errorf("%s of a zero Plan: no error", name)
			}
		}()
	}
}
