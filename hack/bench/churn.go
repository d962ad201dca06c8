// Lookups while the cluster churns: lookup latency on 2 goroutines, idle
// and while a writer applies watch events at a steady rate, for an engine
// and for a client-go indexer holding the same objects.

package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	gosync "sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/iidp/metasync/internal/feed"
	msync "github.com/iidp/metasync/sync"
)

var (
	churnRate = flag.Int("churn-rate", 1000, "watch events per second for the lookups-under-churn rows (0: skip)")
	churnFor  = flag.Duration("churn-for", 3*time.Second, "how long each lookups-under-churn measure runs")
)

// latencies are the p99 and p999 of one side's lookups, idle and under
// churn, in ns.
type latencies struct{ idle99, idle999, churn99, churn999, rate float64 }

// churnLookupRows measures both sides: the engine fed through package
// feed (the projection and the indexer a watch event goes through, without
// the apiserver, which could not take 1,000 writes/s beside the rest on
// this machine) and a cache.Indexer with the informer's index func, each
// written by one goroutine at churnRate updates a second (an AppModel's
// models change) while two goroutines look up random keys, each lookup
// timed.
func churnLookupRows(keys []string) ([]row, error) {
	p, err := plan()
	if err != nil {
		return nil, err
	}
	e, f, err := feed.New(p, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	engine := e.(*msync.Engine)
	raw := make([][]byte, *n)
	for i := range *n {
		u := appModel(i)
		u.SetNamespace(ns)
		if raw[i], err = json.Marshal(u.Object); err != nil {
			return nil, err
		}
	}
	if err := f.Replace("appmodels", raw...); err != nil {
		return nil, err
	}
	ix, _ := engine.Index("model-to-app")
	ms, err := measureChurn2(keys, func(k string) int { return len(ix.Lookup(k)) }, func(i int, extra string) error {
		u := appModel(i, extra)
		u.SetNamespace(ns)
		b, _ := json.Marshal(u.Object)
		return f.Apply("appmodels", b)
	})
	if err != nil {
		return nil, err
	}

	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{"model": func(obj any) ([]string, error) {
		models, _, _ := unstructured.NestedStringSlice(obj.(*unstructured.Unstructured).Object, "spec", "models")
		return models, nil
	}})
	for i := range *n {
		u := appModel(i)
		u.SetNamespace(ns)
		if err := idx.Add(u); err != nil {
			return nil, err
		}
	}
	inf, err := measureChurn2(keys, func(k string) int { objs, _ := idx.ByIndex("model", k); return len(objs) }, func(i int, extra string) error {
		u := appModel(i, extra)
		u.SetNamespace(ns)
		return idx.Update(u)
	})
	if err != nil {
		return nil, err
	}
	logf("churn: engine %.0f events/s, indexer %.0f events/s", ms.rate, inf.rate)
	return []row{
		{name: "lookup p99, 2 goroutines, idle", unit: "ns", baseline: inf.idle99, metasync: ms.idle99},
		{name: "lookup p999, 2 goroutines, idle", unit: "ns", baseline: inf.idle999, metasync: ms.idle999},
		{name: fmt.Sprintf("lookup p99, 2 goroutines, %d events/s", *churnRate), unit: "ns", baseline: inf.churn99, metasync: ms.churn99, target: atMost(1.3*ms.idle99, "≤ 1.3 × idle p99")},
		{name: fmt.Sprintf("lookup p999, 2 goroutines, %d events/s", *churnRate), unit: "ns", baseline: inf.churn999, metasync: ms.churn999, target: atMost(1.3*ms.idle99, "≤ 1.3 × idle p99")},
	}, nil
}

// measureChurn2 times lookups on 2 goroutines for churnFor, idle, then
// while write(i, extra) runs at churnRate a second on another goroutine.
func measureChurn2(keys []string, lookup func(string) int, write func(i int, extra string) error) (latencies, error) {
	var l latencies
	timedLookups(keys, lookup) // warms the caches and the runtime: not counted
	l.idle99, l.idle999 = timedLookups(keys, lookup)
	stop := make(chan struct{})
	var wrote atomic.Int64
	var werr error
	var wg gosync.WaitGroup
	wg.Go(func() {
		// Paced in steps of 10 ms: a ticker of 1 ms is not kept on a
		// loaded machine; each step writes what the rate asks by then.
		start := time.Now()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for k := 0; ; {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			due := int(time.Since(start).Seconds() * float64(*churnRate))
			for ; k < due; k++ {
				if err := write(k%*n, fmt.Sprintf("churn-%d", k)); err != nil {
					werr = err
					return
				}
				wrote.Add(1)
			}
		}
	})
	start := time.Now()
	l.churn99, l.churn999 = timedLookups(keys, lookup)
	close(stop)
	wg.Wait()
	l.rate = float64(wrote.Load()) / time.Since(start).Seconds()
	return l, werr
}

// timedLookups runs 2 goroutines of random lookups for churnFor, each
// timed, and returns the p99 and p999 in ns.
func timedLookups(keys []string, lookup func(string) int) (p99, p999 float64) {
	var mu gosync.Mutex
	var all []time.Duration
	var wg gosync.WaitGroup
	deadline := time.Now().Add(*churnFor)
	for g := range 2 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 9))
			ds := make([]time.Duration, 0, 1<<20)
			for time.Now().Before(deadline) {
				for range 1000 {
					k := keys[r.IntN(len(keys))]
					t := time.Now()
					lookup(k)
					ds = append(ds, time.Since(t))
				}
			}
			mu.Lock()
			all = append(all, ds...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(all)
	at := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))].Nanoseconds()) }
	return at(0.99), at(0.999)
}
