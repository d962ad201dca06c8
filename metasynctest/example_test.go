package metasynctest_test

import (
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
