package metasynctest_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// Example feeds a Fake the objects a test needs, as YAML, and reads it as
// code under test reads the engine: a lookup, a chain, typed fields. A test
// of a real program would rather load its config file with Load.
func Example() {
	plan, err := schema.Compile(&schema.Config{
		Resources: []schema.Resource{{
			Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
			Namespace: "meta-test", LabelSelector: "iidp=iidp",
			Fields:  map[string]string{"name": "metadata.name", "version": "spec.version"},
			Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
		}, {
			Name: "endpointslices", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices",
			Namespace: "meta-test", LabelSelector: "kubernetes.io/service-name",
			Indexes: []schema.Index{{
				Name:     "service-to-addresses",
				Key:      `metadata.labels.kubernetes\.io/service-name`,
				Value:    `@endpoints`,
				Fallback: `@endpoints:{"terminating":true}`,
			}},
		}},
		Chains: []schema.Chain{{Name: "model-to-addresses", Indexes: []string{"model-to-app", "service-to-addresses"}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		log.Fatal(err)
	}

	err = fake.Apply("appmodels", `
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: iiot, namespace: meta-test, labels: {iidp: iidp}}
spec: {version: 2.8.2, models: [iiot_dataservice, iiot_edge_project]}
`)
	if err != nil {
		log.Fatal(err)
	}
	err = fake.Apply("endpointslices", `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: iiot-abc, namespace: meta-test, labels: {kubernetes.io/service-name: iiot}}
endpoints:
- {addresses: [10.0.3.10], conditions: {ready: true}}
- {addresses: [10.0.3.11], conditions: {ready: false}}
`)
	if err != nil {
		log.Fatal(err)
	}

	fmt.Println(fake.Lookup("model-to-app", "iiot_dataservice"))
	fmt.Println(fake.Resolve("model-to-addresses", "iiot_dataservice"))

	type AppModel struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	apps, err := msync.Objects[AppModel](fake, "model-to-app", "iiot_dataservice")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%+v\n", apps)

	if err := fake.Delete("appmodels", "meta-test/iiot"); err != nil {
		log.Fatal(err)
	}
	fmt.Println(fake.Lookup("model-to-app", "iiot_dataservice"))
	// Output:
	// [iiot]
	// [10.0.3.10]
	// [{Name:iiot Version:2.8.2}]
	// []
}

// ExampleUnsynced starts a resource as an engine's is before its first
// list: an answer that depends on it is not Synced, so that code under
// test can be checked to tell "none" from "not known yet". Its first
// Replace is that list.
func ExampleUnsynced() {
	plan, err := schema.Compile(&schema.Config{
		Resources: []schema.Resource{{
			Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
			Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fake, err := metasynctest.New(plan, metasynctest.Unsynced("appmodels"))
	if err != nil {
		log.Fatal(err)
	}
	a := fake.Answer(msync.KeyOf("model-to-app", "model1"))
	fmt.Println(a.Values, "synced:", a.Synced)

	err = fake.Replace("appmodels", `
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: iiot, namespace: demo}
spec: {models: [model1]}
`)
	if err != nil {
		log.Fatal(err)
	}
	a = fake.Answer(msync.KeyOf("model-to-app", "model1"))
	fmt.Println(a.Values, "synced:", a.Synced)
	// Output:
	// [] synced: false
	// [iiot] synced: true
}

// ExampleRuleErrors shows an object that an index's rule skips: Apply
// applies it as the engine would, without that index's entries, and
// returns a *RuleErrors that names the object, the index and what the
// rule met, where the daemon logs and counts it.
func ExampleRuleErrors() {
	plan, err := schema.Compile(&schema.Config{
		Resources: []schema.Resource{{
			Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
			Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name", MaxEntriesPerObject: 2}},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		log.Fatal(err)
	}
	err = fake.Apply("appmodels", `
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: iiot, namespace: demo}
spec: {models: [model1, model2, model3]}
`)
	var re *metasynctest.RuleErrors
	if errors.As(err, &re) {
		for _, e := range re.Errors {
			fmt.Println(e)
		}
	}
	fmt.Println(fake.Lookup("model-to-app", "model1"))
	// Output:
	// appmodels: object demo/iiot: index model-to-app: over maxEntriesPerObject (2 entries, 256 bytes): spec.models yields 3 values on this object, over the limit of 2; the object adds nothing to this index
	// []
}
