package sync_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"

	"k8s.io/client-go/tools/clientcmd"

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
