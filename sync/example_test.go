package sync_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// Example builds an engine from a config given as Go values, waits until
// every resource is listed, and reads the indexes: a lookup, and the typed
// fields of the objects behind a key. It needs a cluster, so go test
// compiles it but does not run it; examples/library is the complete
// program, run by its tests.
func Example() {
	// The *rest.Config as kubectl finds it: KUBECONFIG, ~/.kube/config,
	// else in-cluster.
	restConfig, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		log.Fatal(err)
	}
	plan, err := schema.Compile(&schema.Config{Resources: []schema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Namespace: "meta-test", LabelSelector: "iidp=iidp",
		Fields:  map[string]string{"version": "spec.version"},
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}})
	if err != nil {
		log.Fatal(err)
	}
	engine, err := msync.New(plan, restConfig, msync.Options{})
	if err != nil {
		log.Fatal(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() { _ = engine.Start(ctx) }() // runs the watches until ctx ends
	if err := engine.WaitForSync(ctx); err != nil {
		log.Fatal(err)
	}

	fmt.Println(engine.Lookup("model-to-app", "iiot_dataservice")) // [iiot]

	type AppModel struct {
		Version string `json:"version"`
	}
	objs, err := msync.Objects[AppModel](engine, "model-to-app", "iiot_dataservice")
	if err != nil {
		log.Fatal(err)
	}
	for _, o := range objs {
		fmt.Println(o.Version) // 2.8.2
	}
}

// Example_appModel shows how to make code that reads metasync testable:
// write it against msync.Reader. A unit test hands it a metasynctest.Fake
// fed with YAML; the program hands it the *msync.Engine. Both run the same
// plan, so the test exercises the real rules too.
func Example_appModel() {
	// route is the code under test: the ready addresses of each app that
	// serves a model. It knows only msync.Reader.
	route := func(r msync.Reader, model string) ([]string, error) {
		type AppModel struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		}
		apps, err := msync.Objects[AppModel](r, "model-to-app", model)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, app := range apps {
			for _, addr := range r.Lookup("service-to-addresses", app.Name) {
				out = append(out, app.Name+"@"+app.Version+" "+addr)
			}
		}
		return out, nil
	}

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
	})
	if err != nil {
		log.Fatal(err)
	}

	// In production, route reads the engine, once it has synced:
	//
	//	engine, err := msync.New(plan, restConfig, msync.Options{})
	//	...
	//	go engine.Start(ctx)
	//	if err := engine.WaitForSync(ctx); err != nil { ... }
	//	addrs, err := route(engine, "iiot_dataservice")
	//
	// In a test, it reads a fake built from the same plan:
	fake, err := metasynctest.New(plan)
	if err != nil {
		log.Fatal(err)
	}
	if err := fake.Apply("appmodels", `
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: iiot, namespace: meta-test, labels: {iidp: iidp}}
spec: {version: 2.8.2, models: [iiot_dataservice]}
`); err != nil {
		log.Fatal(err)
	}
	if err := fake.Apply("endpointslices", `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: iiot-abc, namespace: meta-test, labels: {kubernetes.io/service-name: iiot}}
endpoints:
- {addresses: [10.0.3.10], conditions: {ready: true}}
- {addresses: [10.0.3.11], conditions: {ready: false}}
`); err != nil {
		log.Fatal(err)
	}

	addrs, err := route(fake, "iiot_dataservice")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(addrs)
	// Output: [iiot@2.8.2 10.0.3.10]
}

// ExampleList decodes the projected fields of every object of a resource
// into a struct whose json tags name the fields, ordered by object key.
// Object does the same for one object.
func ExampleList() {
	plan, err := schema.Compile(&schema.Config{Resources: []schema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Fields:  map[string]string{"name": "metadata.name", "version": "spec.version"},
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}})
	if err != nil {
		log.Fatal(err)
	}
	fake, err := metasynctest.New(plan) // or the *msync.Engine
	if err != nil {
		log.Fatal(err)
	}
	if err := fake.Apply("appmodels", `
metadata: {name: iiot, namespace: meta-test}
spec: {version: 2.8.2, models: [iiot_dataservice]}
---
metadata: {name: base, namespace: meta-test}
spec: {version: "1.0", models: [model1]}
`); err != nil {
		log.Fatal(err)
	}

	type AppModel struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	apps, err := msync.List[AppModel](fake, "appmodels")
	if err != nil {
		log.Fatal(err)
	}
	for _, app := range apps {
		fmt.Println(app.Name, app.Version)
	}
	// Output:
	// base 1.0
	// iiot 2.8.2
}
