// The workload: the AppModels the bench writes to the control plane, and the
// raw LIST of them that the initial syncs are measured against.

package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	gosync "sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// model is the name of AppModel i's j-th model: the key that both the
// informer's index and metasync's model-to-app index are looked up by.
func model(i, j int) string { return fmt.Sprintf("model-%06d-%d", i, j) }

// appModel is AppModel app-<i>, labelled iidp=iidp, with its three models
// and any extra ones.
func appModel(i int, extra ...string) *unstructured.Unstructured {
	models := []any{model(i, 0), model(i, 1), model(i, 2)}
	for _, e := range extra {
		models = append(models, e)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "iidp.com/v1", "kind": "AppModel",
		"metadata": map[string]any{"name": fmt.Sprintf("app-%06d", i), "labels": map[string]any{"iidp": "iidp"}},
		"spec":     map[string]any{"type": "model", "version": "1.7", "models": models},
	}}
}

// applyApp server-side applies appModel(i, extra...), forced, as the field
// manager appmodels-manager.
func applyApp(ctx context.Context, dyn dynamic.Interface, i int, extra ...string) error {
	_, err := dyn.Resource(gvr).Namespace(ns).Apply(ctx, fmt.Sprintf("app-%06d", i), appModel(i, extra...),
		metav1.ApplyOptions{FieldManager: "appmodels-manager", Force: true})
	return err
}

// populate creates the -n AppModels with -workers parallel writers and
// returns the first error, if any.
func populate(ctx context.Context, dyn dynamic.Interface) error {
	return inParallel(*n, func(i int) error {
		if i > 0 && i%10000 == 0 {
			logf("  %d created", i)
		}
		return applyApp(ctx, dyn, i)
	})
}

// inParallel calls f for 0 to n-1 on -workers goroutines and returns the
// first error; after one, no more calls start.
func inParallel(n int, f func(i int) error) error {
	var next atomic.Int64
	var wg gosync.WaitGroup
	var failed atomic.Pointer[error]
	for range *workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				if err := f(i); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	return nil
}

// rawList times the bytes of the LIST that metasync's first list sends
// (label selector, current state, one response), median of runs.
func rawList(ctx context.Context, cfg *rest.Config, runs int) (time.Duration, int, error) {
	c, err := rest.RESTClientFor(restCfgFor(cfg))
	if err != nil {
		return 0, 0, err
	}
	var durs []time.Duration
	size := 0
	for range runs {
		start := time.Now()
		body, err := c.Get().AbsPath("/apis/iidp.com/v1/namespaces", ns, "appmodels").
			Param("labelSelector", "iidp=iidp").Do(ctx).Raw()
		if err != nil {
			return 0, 0, err
		}
		durs = append(durs, time.Since(start))
		size = len(body)
	}
	return median(durs), size, nil
}

// restCfgFor is cfg for a REST client of iidp.com/v1 that asks for JSON.
func restCfgFor(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &schema.GroupVersion{Group: "iidp.com", Version: "v1"}
	c.APIPath = "/apis"
	c.NegotiatedSerializer = clientscheme.Codecs.WithoutConversion()
	c.AcceptContentTypes = "application/json"
	return c
}

// rawStreamingList times a streaming list of the AppModels (a watch with
// sendInitialEvents), bytes only, until the bookmark that ends its
// initial events; the median of runs and the bytes read.
func rawStreamingList(ctx context.Context, cfg *rest.Config, runs int) (time.Duration, int, error) {
	c, err := rest.RESTClientFor(restCfgFor(cfg))
	if err != nil {
		return 0, 0, err
	}
	var durs []time.Duration
	size := 0
	buf := make([]byte, 256<<10)
	for range runs {
		start := time.Now()
		body, err := c.Get().AbsPath("/apis/iidp.com/v1/namespaces", ns, "appmodels").
			Param("labelSelector", "iidp=iidp").Param("watch", "true").Param("sendInitialEvents", "true").
			Param("resourceVersionMatch", "NotOlderThan").Param("allowWatchBookmarks", "true").Stream(ctx)
		if err != nil {
			return 0, 0, err
		}
		var tail []byte
		size = 0
		for {
			n, err := body.Read(buf)
			size += n
			tail = append(tail[max(0, len(tail)-64):], buf[:n]...)
			if bytes.Contains(tail, []byte("k8s.io/initial-events-end")) {
				break
			}
			if err != nil {
				body.Close()
				return 0, 0, fmt.Errorf("streaming list: %w", err)
			}
		}
		body.Close()
		durs = append(durs, time.Since(start))
	}
	return median(durs), size, nil
}

// benchKeys are the models of the N AppModels, shuffled with a fixed seed:
// the lookups' keys.
func benchKeys() []string {
	keys := make([]string, 0, 3**n)
	for i := range *n {
		for j := range 3 {
			keys = append(keys, model(i, j))
		}
	}
	rand.New(rand.NewPCG(7, 7)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys
}
