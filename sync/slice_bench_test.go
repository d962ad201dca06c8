package sync

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/iidp/metasync/indexer"
	"github.com/iidp/metasync/schema"
)

// benchSliceJSON is an EndpointSlice as the apiserver sends it: service svc-S,
// slice N, 20 endpoints (the one at flip not ready), a port named http,
// managed fields and all.
func benchSliceJSON(s, n, flip, rv int) string {
	var eps strings.Builder
	for i := range 20 {
		if i > 0 {
			eps.WriteByte(',')
		}
		ready := i != flip
		fmt.Fprintf(&eps, `{"addresses":["10.%d.%d.%d"],"conditions":{"ready":%t,"serving":%t,"terminating":false},"nodeName":"node-%d","targetRef":{"kind":"Pod","name":"svc-%d-%d-%d","namespace":"bench","uid":"0d7b-4a51-9d3e-%06d"},"zone":"zone-%d"}`,
			s/256, s%256, n*20+i, ready, ready, i%7, s, n, i, s*100+i, i%3)
	}
	return fmt.Sprintf(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"svc-%d-%d","namespace":"bench","resourceVersion":"%d","uid":"4f1c2a8e-%06d-%d","labels":{"kubernetes.io/service-name":"svc-%d","endpointslice.kubernetes.io/managed-by":"endpointslice-controller.k8s.io"},"managedFields":[{"manager":"kube-controller-manager","operation":"Update","apiVersion":"discovery.k8s.io/v1","fieldsType":"FieldsV1","fieldsV1":{"f:addressType":{},"f:endpoints":{},"f:ports":{}}}]},"addressType":"IPv4","endpoints":[%s],"ports":[{"name":"http","port":8080,"protocol":"TCP"}]}`,
		s, n, rv, s, n, s, eps.String())
}

// sliceRules are the index rules compared: the bare gjson rule of earlier
// configs, and the EndpointSlice semantics of @endpoints with its fallback,
// as bare addresses and as IP:PORT.
var sliceRules = []struct {
	name string
	ix   schema.Index
}{
	{"bare-gjson", schema.Index{Value: `endpoints.#(conditions.ready==true)#.addresses|@flatten`}},
	{"endpoints", schema.Index{Value: `@endpoints`}},
	{"endpoints+fallback", schema.Index{Value: `@endpoints`, Fallback: `@endpoints:{"terminating":true}`}},
	{"endpoints+port+fallback", schema.Index{Value: `@endpoints:{"port":"http"}`, Fallback: `@endpoints:{"port":"http","terminating":true}`}},
	// The reference setup's service-to-endpoints: hints too (these
	// slices carry none, as most do).
	{"endpoints+port+fallback+hints", schema.Index{Value: `@endpoints:{"port":"http"}`, Fallback: `@endpoints:{"port":"http","terminating":true}`, Hints: `@endpoints:{"port":"http","hints":true}`}},
}

func sliceWatcher(b *testing.B, ix schema.Index) *follow.Watcher {
	ix.Name = "service-to-addresses"
	ix.Key = `metadata.labels.kubernetes\.io/service-name`
	return watchersOf(testEngine(b, &schema.Config{Resources: []schema.Resource{{
		Name: "endpointslices", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices",
		Indexes: []schema.Index{ix},
	}}}))[0]
}

// BenchmarkSliceEvent is an engine's work for one EndpointSlice event (one
// endpoint turns not ready, another ready again), from the object's JSON
// to the commit, on 2,000 slices of 1,000 services; and the live heap per
// slice held (heap-B/slice), for each rule.
func BenchmarkSliceEvent(b *testing.B) {
	const services, perService = 1000, 2
	for _, r := range sliceRules {
		b.Run("rule="+r.name, func(b *testing.B) {
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			w := sliceWatcher(b, r.ix)
			objs := make([]indexer.Object, 0, services*perService)
			for s := range services {
				for n := range perService {
					objs = append(objs, w.Project(benchSliceJSON(s, n, -1, 1000)).Ix)
				}
			}
			w.Src.Replace(objs)
			objs = nil
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			held := float64(after.HeapAlloc-before.HeapAlloc) / (services * perService)
			events := make([]string, 256)
			for i := range events {
				events[i] = benchSliceJSON(i*7%services, i%perService, i%20, 2000+i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				o := w.Project(events[i%len(events)])
				tx := w.Src.Begin()
				tx.Put(o.Ix)
				tx.Commit()
			}
			b.StopTimer()
			b.ReportMetric(held, "heap-B/slice")
			runtime.KeepAlive(w)
		})
	}
}
