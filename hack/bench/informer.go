// The baseline: the plain client-go approach, a filtered dynamic informer
// with a cache.Indexers index func, measured the same way as metasync.

package main

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// seedInformer is the seed's approach: a filtered dynamic informer with
// a cache.Indexers index func on spec.models. Start the factory to run it.
func seedInformer(dyn dynamic.Interface) (dynamicinformer.DynamicSharedInformerFactory, cache.SharedIndexInformer, error) {
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, func(o *metav1.ListOptions) {
		o.LabelSelector = "iidp=iidp"
	})
	inf := factory.ForResource(gvr).Informer()
	err := inf.AddIndexers(cache.Indexers{"model": func(obj any) ([]string, error) {
		models, _, _ := unstructured.NestedStringSlice(obj.(*unstructured.Unstructured).Object, "spec", "models")
		return models, nil
	}})
	return factory, inf, err
}

// measureInformer starts the plain informer and measures its initial sync,
// its heap per object and its lookups. It returns a function that tells
// whether a model is in the informer's index yet (for latency), and one
// that stops the informer, which runs until then.
func measureInformer(ctx context.Context, dyn dynamic.Interface, keys []string) (result, func(string) bool, func(), error) {
	r, inf, stop, err := measureAnInformer("informer", dyn, keys, seedInformer)
	if err != nil {
		return r, nil, nil, err
	}
	idx := inf.GetIndexer()
	visible := func(m string) bool {
		objs, _ := idx.ByIndex("model", m)
		return len(objs) > 0
	}
	return r, visible, stop, nil
}

// measureAnInformer starts the informer that start makes and measures its
// initial sync, heap per object and lookups (its ByIndex); stop stops it.
func measureAnInformer(name string, dyn dynamic.Interface, keys []string,
	start func(dynamic.Interface) (dynamicinformer.DynamicSharedInformerFactory, cache.SharedIndexInformer, error),
) (r result, inf cache.SharedIndexInformer, stop func(), err error) {
	before := heap()
	logf("%s: syncing", name)
	began := time.Now()
	factory, inf, err := start(dyn)
	if err != nil {
		return r, nil, nil, err
	}
	done := make(chan struct{})
	stop = func() { close(done); factory.Shutdown() }
	factory.Start(done)
	if !cache.WaitForCacheSync(done, inf.HasSynced) {
		stop()
		return r, nil, nil, fmt.Errorf("%s did not sync", name)
	}
	r.sync = time.Since(began)
	r.bytesPerObject = float64(heap()-before) / float64(*n)
	logf("%s: synced in %s, %.0f B per object", name, r.sync, r.bytesPerObject)
	idx := inf.GetIndexer()
	r.lookupHot, r.lookupRandom, r.lookupParallel, r.lookupAllocs = benchLookups(keys, func(k string) int {
		objs, _ := idx.ByIndex("model", k)
		return len(objs)
	})
	return r, inf, stop, nil
}

// tunedInformer is the strongest client-go peer: the seed's informer with
// a transform that keeps, of each AppModel, only what its index and its
// identity need (name, namespace, resourceVersion, spec.models), so that
// its cache holds no managed fields, labels or other fields.
func tunedInformer(dyn dynamic.Interface) (dynamicinformer.DynamicSharedInformerFactory, cache.SharedIndexInformer, error) {
	factory, inf, err := seedInformer(dyn)
	if err != nil {
		return nil, nil, err
	}
	err = inf.SetTransform(func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil // a tombstone: as it is
		}
		slim := &unstructured.Unstructured{Object: map[string]any{}}
		slim.SetName(u.GetName())
		slim.SetNamespace(u.GetNamespace())
		slim.SetResourceVersion(u.GetResourceVersion())
		if models, found, _ := unstructured.NestedStringSlice(u.Object, "spec", "models"); found {
			ms := make([]any, len(models))
			for i, m := range models {
				ms[i] = m
			}
			slim.Object["spec"] = map[string]any{"models": ms}
		}
		return slim, nil
	})
	return factory, inf, err
}

// measureTunedInformer starts the tuned informer, measures its initial
// sync, heap per object and lookups (its ByIndex), and stops it.
func measureTunedInformer(dyn dynamic.Interface, keys []string) (result, error) {
	r, _, stop, err := measureAnInformer("tuned informer", dyn, keys, tunedInformer)
	if err == nil {
		stop()
	}
	return r, err
}
