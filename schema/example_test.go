package schema_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/iidp/metasync/schema"
)

// ExampleCompile builds the reference config as a Go literal instead of a
// file: AppModels give model -> app, the EndpointSlices of each app's
// Service give app -> ready addresses, and a chain joins the two.
func ExampleCompile() {
	plan, err := schema.Compile(&schema.Config{
		Resources: []schema.Resource{{
			Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
			Namespace: "meta-test", LabelSelector: "iidp=iidp",
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
	// Settings left out get their defaults.
	fmt.Println(plan.Server().Listen)
	// Output: 127.0.0.1:8080
}

// ExampleProblems shows that Compile reports every mistake of a config at
// once, each at its field path: Problems splits the error, and each
// problem is a *schema.FieldError.
func ExampleProblems() {
	_, err := schema.Compile(&schema.Config{
		Resources: []schema.Resource{{
			Name: "appmodels", Group: "iidp.com", Resource: "appmodels", // no version
			Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models.#(", MaxEntriesPerObject: -1}},
		}},
		Chains: []schema.Chain{{Name: "model-to-addresses", Indexes: []string{"model-to-app", "service-to-addresses"}}},
	})
	for _, p := range schema.Problems(err) {
		var fe *schema.FieldError
		if errors.As(p, &fe) {
			fmt.Printf("%s: %s\n", fe.Path, fe.Msg)
		}
	}
	// Output:
	// resources[0].version: required (for example v1)
	// resources[0].indexes[0].key: "spec.models.#(": query "#(" is not closed
	// resources[0].indexes[0].maxEntriesPerObject: -1 is negative; omit it (or use 0) for the default of 10000
	// chains[0].indexes[1]: unknown index "service-to-addresses" (known: model-to-app)
}
