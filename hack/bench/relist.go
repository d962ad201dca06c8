// Memory through a relist: how far the heap rises above its steady state
// while an engine relists.

package main

import (
	"context"
	"runtime"
	"runtime/metrics"
	"time"

	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// measureRelist runs an engine that relists every 2 s and samples the heap
// every millisecond through one relist, above the heap before the engine:
// the live heap as each GC during the relist found it, and the heap with
// its garbage, each against the steady state after a GC.
func measureRelist(ctx context.Context, cfg *rest.Config) (live, total float64, err error) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	liveNow := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	base := heap()
	baseLive := liveNow()
	p, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Namespace: ns, LabelSelector: "iidp=iidp", Resync: 2 * time.Second,
		Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}})
	if err != nil {
		return 0, 0, err
	}
	e, err := msync.New(p, cfg, msync.Options{Logger: quiet})
	if err != nil {
		return 0, 0, err
	}
	ectx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = e.Start(ectx); close(done) }()
	defer func() { cancel(); <-done }()
	if err := e.WaitForSync(ctx); err != nil {
		return 0, 0, err
	}
	steady := heap() - base
	steadyLive := liveNow() - baseLive
	relists := e.Status()[0].Relists
	var peak, peakLive uint64
	var m runtime.MemStats
	for e.Status()[0].Relists < relists+1 {
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapAlloc-base)
		if l := liveNow(); l > baseLive {
			peakLive = max(peakLive, l-baseLive)
		}
		time.Sleep(time.Millisecond)
	}
	// The GC after the relist sees the last moment both copies are alive.
	runtime.GC()
	peakLive = max(peakLive, liveNow()-baseLive)
	logf("relist: steady %d B (live %d B); peak %d B with garbage, %d B live", steady, steadyLive, peak, peakLive)
	return float64(peakLive) / float64(steadyLive), float64(peak) / float64(steady), nil
}
