package sync

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/iidp/metasync/schema"
)

// BenchmarkClustersMemory measures the heap that the engine holds per
// object, AppModels as the reference setup projects them: one cluster of
// N objects against two clusters of N/2 each (the same objects' shapes,
// other names), whose object keys carry the cluster. Run:
//
//	go test -run XXX -bench ClustersMemory -benchtime 1x ./sync/
func BenchmarkClustersMemory(b *testing.B) {
	const n = 20000
	for _, fields := range []bool{true, false} {
		for _, clusters := range []int{1, 2} {
			name := fmt.Sprintf("clusters=%d", clusters)
			if !fields {
				name = "nofields/" + name
			}
			benchClustersMemory(b, name, n, clusters, fields)
		}
	}
}

// benchClustersMemory is one case of BenchmarkClustersMemory: fields, the
// reference setup's projection, or none (then only a config of several
// clusters keeps the object keys behind each index key).
func benchClustersMemory(b *testing.B, name string, n, clusters int, fields bool) {
	{
		b.Run(name, func(b *testing.B) {
			for range b.N {
				cfg := &schema.Config{Resources: []schema.Resource{{
					Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
					Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
				}}}
				if fields {
					cfg.Resources[0].Fields = map[string]string{"type": "spec.type", "version": "spec.version", "models": "spec.models"}
				}
				if clusters > 1 {
					cfg.Clusters = []schema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/unused"}}
				}
				before := heap()
				e := testEngine(b, cfg)
				v, _ := e.view()
				parts := v.byName["appmodels"].parts
				per := n / len(parts)
				for p, w := range parts {
					items := make([]any, per)
					for i := range per {
						name := fmt.Sprintf("app-%d-%06d", p, i)
						items[i] = w.Project(fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"meta-test","resourceVersion":"%d","creationTimestamp":"2026-12-01T10:00:00Z"},"spec":{"type":"model","version":"1.7","models":["m-%s-a","m-%s-b"]}}`,
							name, i+1, name, name))
					}
					if err := w.Replace(items, "1"); err != nil {
						b.Fatal(err)
					}
				}
				after := heap()
				b.ReportMetric(float64(after-before)/float64(n), "B/object")
				runtime.KeepAlive(e)
			}
		})
	}
}

func heap() uint64 {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
