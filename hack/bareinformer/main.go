// Command bareinformer is the seed's approach alone, for the resident
// memory rows of `make bench`: a filtered dynamic informer of AppModels
// with an index from spec.models, and nothing else linked in. With
// -tuned, the strongest client-go peer: a transform keeps of each object
// only its name, namespace, resourceVersion and spec.models (as
// hack/bench's tunedInformer). It prints "synced N" once the informer has
// synced, then waits to be killed.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "", "namespace of the AppModels")
	tuned := flag.Bool("tuned", false, "keep only name, namespace, resourceVersion and spec.models of each object (a transform)")
	flag.Parse()
	// run serves until it fails: it returns only an error.
	fmt.Fprintln(os.Stderr, "bareinformer:", run(*kubeconfig, *namespace, *tuned))
	os.Exit(1)
}

func run(kubeconfig, namespace string, tuned bool) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, namespace, func(o *metav1.ListOptions) {
		o.LabelSelector = "iidp=iidp"
	})
	inf := factory.ForResource(schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}).Informer()
	if err := inf.AddIndexers(cache.Indexers{"model": func(obj any) ([]string, error) {
		models, _, _ := unstructured.NestedStringSlice(obj.(*unstructured.Unstructured).Object, "spec", "models")
		return models, nil
	}}); err != nil {
		return err
	}
	if tuned {
		if err := inf.SetTransform(slim); err != nil {
			return err
		}
	}
	stop := make(chan struct{})
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		return errors.New("informer did not sync")
	}
	fmt.Println("synced", len(inf.GetStore().ListKeys()))
	select {}
}

// slim keeps of an AppModel what its index and identity need.
func slim(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil // a tombstone: as it is
	}
	out := &unstructured.Unstructured{Object: map[string]any{}}
	out.SetName(u.GetName())
	out.SetNamespace(u.GetNamespace())
	out.SetResourceVersion(u.GetResourceVersion())
	if models, found, _ := unstructured.NestedStringSlice(u.Object, "spec", "models"); found {
		ms := make([]any, len(models))
		for i, m := range models {
			ms[i] = m
		}
		out.Object["spec"] = map[string]any{"models": ms}
	}
	return out, nil
}
