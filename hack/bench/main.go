// Command bench measures metasync side by side with the plain client-go
// approach (a dynamic informer with a cache.Indexers index func) on one
// real control plane, with the same AppModels, in one run, and prints one
// table with both columns and their ratios. `make bench` runs it; see
// BENCHMARKS.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/iidp/metasync/indexer"
	"github.com/iidp/metasync/internal/api"
	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

var (
	n               = flag.Int("n", 10000, "AppModels to create (3 models each)")
	workers         = flag.Int("workers", 16, "parallel writers while populating")
	writes          = flag.Int("writes", 1000, "writes for the write-to-visible latency")
	fanout          = flag.Int("fanout", 50, "engines in one process for the fan-out test (0: skip)")
	fanoutWrites    = flag.Int("fanout-writes", 1000, "writes for the fan-out latency")
	fanoutInformers = flag.Bool("fanout-informers", true, "also time the fan-out with as many plain informers (skipped when n × fanout > 1,000,000: memory)")
	httpDur         = flag.Duration("http", 3*time.Second, "load duration per HTTP server (0: skip)")
	httpConns       = flag.Int("http-conns", 8, "concurrent HTTP clients")
	memProfile      = flag.String("memprofile", "", "write a heap profile after metasync's sync to this file")
	cpuProfile      = flag.String("cpuprofile", "", "write a CPU profile of the fan-out writes to this file")
	apiProfile      = flag.String("apiserver-profile", "", "write the kube-apiserver's CPU profile of 3 s of fan-out writes to this file")
)

var gvr = schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}

const ns = "bench"

type row struct {
	name, unit          string
	baseline, metasync  float64
	target              string
	higherIsBetter, raw bool
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run() error {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return fmt.Errorf("KUBEBUILDER_ASSETS is not set: use `make bench`")
	}
	env := &envtest.Environment{CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{"examples/appmodel/crd.yaml"}, ErrorIfPathMissing: true}}
	cfg, err := env.Start()
	if err != nil {
		return err
	}
	defer env.Stop()
	cfg.QPS, cfg.Burst = 5000, 10000
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	ctx := context.Background()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}

	logf("creating %d AppModels by server-side apply (%d writers)", *n, *workers)
	start := time.Now()
	if err := populate(ctx, dyn); err != nil {
		return err
	}
	logf("created in %s", time.Since(start).Round(time.Millisecond))

	keys := make([]string, 0, 3**n)
	for i := range *n {
		for j := range 3 {
			keys = append(keys, model(i, j))
		}
	}
	rand.New(rand.NewPCG(7, 7)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })

	var rows []row
	if _, _, err := rawList(ctx, cfg, 3); err != nil { // warm the apiserver's cache
		return err
	}

	// Initial sync against a raw LIST, interleaved, median of 5 each,
	// before the informer starts: its heap (half a gigabyte at 100,000
	// objects) would slow down every garbage collection of the syncs.
	var syncs, lists []time.Duration
	listBytes := 0
	for range 5 {
		d, size, err := rawList(ctx, cfg, 1)
		if err != nil {
			return err
		}
		lists, listBytes = append(lists, d), size
		e, stop, err := startEngine(cfg)
		if err != nil {
			return err
		}
		start := time.Now()
		if err := e.WaitForSync(ctx); err != nil {
			return err
		}
		syncs = append(syncs, time.Since(start))
		stop()
		runtime.GC() // the next run starts without this one's garbage
	}
	listDur, syncDur := median(lists), median(syncs)
	logf("raw LIST %v (median %s, %d bytes); metasync sync %v (median %s)", lists, listDur, listBytes, syncs, syncDur)
	base, informerSees, stopInformer, err := measureInformer(ctx, dyn, keys)
	if err != nil {
		return err
	}
	ms, engine, stopEngine, err := measureEngine(ctx, cfg, keys)
	if err != nil {
		return err
	}
	ms.sync = syncDur
	// Write -> visible for both from the same writes: the apiserver's
	// noise is the same for both.
	ix, _ := engine.Index("model-to-app")
	lat, err := latency(ctx, dyn, "write", *writes, informerSees, func(m string) bool { return len(ix.Lookup(m)) > 0 })
	if err != nil {
		return err
	}
	base.p50, base.p99, ms.p50, ms.p99 = lat[0].p50, lat[0].p99, lat[1].p50, lat[1].p99
	stopInformer()
	runtime.GC()
	floorHot, floorRandom := lookupsVsMap(keys, ix, &ms)

	rows = append(rows,
		row{name: "heap per indexed object", unit: "B", baseline: base.bytesPerObject, metasync: ms.bytesPerObject, target: "≤ 1/12"},
		row{name: "initial sync (metasync: median of 5)", unit: "s", baseline: base.sync.Seconds(), metasync: ms.sync.Seconds(), target: "≤ 1.3 × raw LIST"},
		row{name: "raw LIST, bytes only (median of 5)", unit: "s", baseline: listDur.Seconds(), metasync: listDur.Seconds(), raw: true},
		row{name: "lookup, hot key", unit: "ns", baseline: base.lookupHot, metasync: ms.lookupHot, target: "≤ 1.3 × map"},
		row{name: "lookup, random keys", unit: "ns", baseline: base.lookupRandom, metasync: ms.lookupRandom, target: "≤ 1.3 × map"},
		row{name: "lookup, random, 2 goroutines", unit: "ns", baseline: base.lookupParallel, metasync: ms.lookupParallel, target: "≤ 1.3 × map"},
		row{name: "lookup allocs", unit: "allocs", baseline: base.lookupAllocs, metasync: ms.lookupAllocs, target: "0"},
		row{name: "plain map, hot key (floor)", unit: "ns", baseline: floorHot, metasync: floorHot, raw: true},
		row{name: "plain map, random keys (floor)", unit: "ns", baseline: floorRandom.single, metasync: floorRandom.single, raw: true},
		row{name: "plain map, random, 2 goroutines", unit: "ns", baseline: floorRandom.parallel, metasync: floorRandom.parallel, raw: true},
		row{name: "write → visible p50", unit: "ms", baseline: base.p50, metasync: ms.p50},
		row{name: "write → visible p99", unit: "ms", baseline: base.p99, metasync: ms.p99, target: "≤ informer + 1 ms"},
	)
	live, total, err := measureRelist(ctx, cfg)
	if err != nil {
		return err
	}
	rows = append(rows,
		row{name: "relist: peak live heap / steady", unit: "x", metasync: live, target: "≤ 2"},
		row{name: "relist: peak heap with garbage / steady", unit: "x", metasync: total})
	if *fanout > 0 {
		engines, _, err := measureFanout(ctx, dyn, cfg, "engines", engineFollower)
		if err != nil {
			return err
		}
		var informers percentiles
		if *fanoutInformers && *n**fanout <= 1_000_000 {
			if informers, _, err = measureFanout(ctx, dyn, cfg, "informers", informerFollower); err != nil {
				return err
			}
		} else {
			logf("fan-out: %d plain informers skipped", *fanout)
		}
		rows = append(rows,
			row{name: fmt.Sprintf("fan-out: %d of each, p50 all see", *fanout), unit: "ms", baseline: informers.p50, metasync: engines.p50},
			row{name: fmt.Sprintf("fan-out: %d of each, p99 all see", *fanout), unit: "ms", baseline: informers.p99, metasync: engines.p99},
			row{name: "fan-out p50 / one's write → visible p50", unit: "x", baseline: informers.p50 / base.p50, metasync: engines.p50 / ms.p50, raw: true},
			row{name: "fan-out p99 / one's write → visible p99", unit: "x", baseline: informers.p99 / base.p99, metasync: engines.p99 / ms.p99, raw: true, target: "≤ 2"})
	}
	if *httpDur > 0 {
		bare, lookup := measureHTTP(engine, keys)
		rows = append(rows, row{name: "HTTP lookups/s (bare net/http vs API)", unit: "req/s", baseline: bare, metasync: lookup, target: "≥ 70 %", higherIsBetter: true})
	}
	stopEngine()

	fmt.Printf("\nmetasync vs plain dynamic informer — %d AppModels (3 models each), kube-apiserver v1.37.2, %d CPUs, %s\n\n", *n, runtime.NumCPU(), runtime.Version())
	fmt.Printf("| %-40s | %14s | %14s | %8s | %-20s |\n", "measure", "informer", "metasync", "ratio", "target")
	fmt.Printf("|%s|%s|%s|%s|%s|\n", dashes(42), dashes(16), dashes(16), dashes(10), dashes(22))
	for _, r := range rows {
		ratio := r.metasync / r.baseline
		rs := fmt.Sprintf("%.2f", ratio)
		if r.raw {
			rs = "—"
		}
		if r.baseline == 0 {
			rs = "—"
		}
		fmt.Printf("| %-40s | %14s | %14s | %8s | %-20s |\n", r.name, format(r.baseline, r.unit), format(r.metasync, r.unit), rs, r.target)
	}
	fmt.Printf("\ninitial sync / raw LIST: informer %.2f, metasync %.2f (target ≤ 1.30)\n", base.sync.Seconds()/listDur.Seconds(), ms.sync.Seconds()/listDur.Seconds())
	fmt.Printf("lookup / plain map: hot %.2f, random %.2f, parallel %.2f (target ≤ 1.30)\n", ms.lookupHot/floorHot, ms.lookupRandom/floorRandom.single, ms.lookupParallel/floorRandom.parallel)
	fmt.Printf("memory: metasync uses 1/%.1f of the informer's heap per object (target ≥ 12)\n", base.bytesPerObject/ms.bytesPerObject)
	return nil
}

func dashes(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = '-'
	}
	return string(b)
}

func format(v float64, unit string) string {
	switch unit {
	case "B":
		return fmt.Sprintf("%.0f B", v)
	case "s":
		return fmt.Sprintf("%.3f s", v)
	case "ns":
		return fmt.Sprintf("%.1f ns", v)
	case "ms":
		return fmt.Sprintf("%.2f ms", v)
	case "allocs":
		return fmt.Sprintf("%.0f", v)
	case "req/s":
		return fmt.Sprintf("%.0f/s", v)
	case "x":
		if v == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprint(v)
}

func model(i, j int) string { return fmt.Sprintf("model-%06d-%d", i, j) }

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

func applyApp(ctx context.Context, dyn dynamic.Interface, i int, extra ...string) error {
	_, err := dyn.Resource(gvr).Namespace(ns).Apply(ctx, fmt.Sprintf("app-%06d", i), appModel(i, extra...),
		metav1.ApplyOptions{FieldManager: "appmodels-manager", Force: true})
	return err
}

func populate(ctx context.Context, dyn dynamic.Interface) error {
	var next atomic.Int64
	var wg gosync.WaitGroup
	errs := make(chan error, *workers)
	for range *workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= *n {
					return
				}
				if err := applyApp(ctx, dyn, i); err != nil {
					errs <- err
					return
				}
				if i > 0 && i%10000 == 0 {
					logf("  %d created", i)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
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

func restCfgFor(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &schema.GroupVersion{Group: "iidp.com", Version: "v1"}
	c.APIPath = "/apis"
	c.NegotiatedSerializer = clientscheme.Codecs.WithoutConversion()
	c.AcceptContentTypes = "application/json"
	return c
}

type result struct {
	sync                                                  time.Duration
	bytesPerObject                                        float64
	lookupHot, lookupRandom, lookupParallel, lookupAllocs float64
	p50, p99                                              float64
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// benchLookups benchmarks a lookup function over the keys: a hot key,
// random keys on one goroutine, and random keys on every core.
func benchLookups(keys []string, lookup func(string) int) (hot, random, parallel, allocs float64) {
	h := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		k := keys[0]
		for b.Loop() {
			lookup(k)
		}
	})
	r := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			lookup(keys[i%len(keys)])
			i++
		}
	})
	p := testing.Benchmark(func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := rand.IntN(len(keys))
			for pb.Next() {
				lookup(keys[i%len(keys)])
				i++
			}
		})
	})
	return float64(h.NsPerOp()), nsPerOp(r), nsPerOp(p), float64(r.AllocsPerOp())
}

func nsPerOp(r testing.BenchmarkResult) float64 { return float64(r.T.Nanoseconds()) / float64(r.N) }

type floor struct{ single, parallel float64 }

// lookupsVsMap benchmarks the index's lookups and a plain map's, in five
// alternating rounds (the machine's speed drifts from one second to the
// next), and returns the medians of each.
func lookupsVsMap(keys []string, ix indexer.Index, r *result) (float64, floor) {
	// The map owns copies of its keys, filled in object order as an
	// informer's handler would fill it: a query's key never shares memory
	// with the stored one, and the stored keys do not sit in memory in the
	// order of the queries (which would let the map's reads stream).
	m := make(map[string][]string, len(keys))
	for i := range *n {
		for j := range 3 {
			m[model(i, j)] = []string{"app"}
		}
	}
	var mh, mr, mp, ih, ir, ip []float64
	onMap := func() {
		hot, random, parallel, _ := benchLookups(keys, func(k string) int { return len(m[k]) })
		mh, mr, mp = append(mh, hot), append(mr, random), append(mp, parallel)
	}
	onIndex := func() {
		hot, random, parallel, allocs := benchLookups(keys, func(k string) int { return len(ix.Lookup(k)) })
		ih, ir, ip = append(ih, hot), append(ir, random), append(ip, parallel)
		r.lookupAllocs = max(r.lookupAllocs, allocs)
	}
	for round := range 5 {
		// Which goes first alternates too: a drift of the machine's speed
		// within a round favours neither.
		if round%2 == 0 {
			onMap()
			onIndex()
		} else {
			onIndex()
			onMap()
		}
	}
	mid := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	r.lookupHot, r.lookupRandom, r.lookupParallel = mid(ih), mid(ir), mid(ip)
	logf("lookups, ns: map hot %v random %v parallel %v; index hot %v random %v parallel %v", mh, mr, mp, ih, ir, ip)
	return mid(mh), floor{mid(mr), mid(mp)}
}

type percentiles struct{ p50, p99 float64 }

// latency applies writes one after the other, each adding a new model to
// an existing AppModel, and times, for each visible function, from the
// PATCH until it returns true.
func latency(ctx context.Context, dyn dynamic.Interface, tag string, count int, visible ...func(model string) bool) ([]percentiles, error) {
	ds := make([][]float64, len(visible))
	for w := range count {
		i := (w * 7919) % *n
		m := fmt.Sprintf("%s-%d", tag, w)
		start := time.Now()
		if err := applyApp(ctx, dyn, i, m); err != nil {
			return nil, err
		}
		deadline := start.Add(30 * time.Second)
		seen := make([]bool, len(visible))
		for left := len(visible); left > 0; {
			for j, v := range visible {
				if !seen[j] && v(m) {
					seen[j] = true
					left--
					ds[j] = append(ds[j], float64(time.Since(start).Microseconds())/1000)
				}
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%s never became visible", m)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	out := make([]percentiles, len(visible))
	for j, d := range ds {
		slices.Sort(d)
		out[j] = percentiles{d[len(d)/2], d[(len(d)*99)/100]}
	}
	return out, nil
}

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

func measureInformer(ctx context.Context, dyn dynamic.Interface, keys []string) (result, func(string) bool, func(), error) {
	var r result
	before := heap()
	logf("informer: syncing")
	start := time.Now()
	factory, inf, err := seedInformer(dyn)
	if err != nil {
		return r, nil, nil, err
	}
	stop := make(chan struct{})
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		return r, nil, nil, fmt.Errorf("informer did not sync")
	}
	r.sync = time.Since(start)
	r.bytesPerObject = float64(heap()-before) / float64(*n)
	logf("informer: synced in %s, %.0f B per object", r.sync, r.bytesPerObject)
	idx := inf.GetIndexer()
	r.lookupHot, r.lookupRandom, r.lookupParallel, r.lookupAllocs = benchLookups(keys, func(k string) int {
		objs, _ := idx.ByIndex("model", k)
		return len(objs)
	})
	visible := func(m string) bool {
		objs, _ := idx.ByIndex("model", m)
		return len(objs) > 0
	}
	return r, visible, func() { close(stop); factory.Shutdown() }, nil
}

func plan() (*mschema.Plan, error) {
	return mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Namespace: ns, LabelSelector: "iidp=iidp",
		Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}})
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var verbose = flag.Bool("v", false, "log the engine's debug lines")

func engineLogger() *slog.Logger {
	if *verbose {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return quiet
}

func startEngine(cfg *rest.Config) (*msync.Engine, func(), error) {
	p, err := plan()
	if err != nil {
		return nil, nil, err
	}
	e, err := msync.New(p, cfg, msync.Options{Logger: engineLogger()})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Start(ctx); close(done) }()
	return e, func() { cancel(); <-done }, nil
}

func measureEngine(ctx context.Context, cfg *rest.Config, keys []string) (result, *msync.Engine, func(), error) {
	var r result
	before := heap()
	logf("metasync: syncing")
	start := time.Now()
	e, stop, err := startEngine(cfg)
	if err != nil {
		return r, nil, nil, err
	}
	if err := e.WaitForSync(ctx); err != nil {
		return r, nil, nil, err
	}
	r.sync = time.Since(start)
	r.bytesPerObject = float64(heap()-before) / float64(*n)
	logf("metasync: synced in %s, %.0f B per object", r.sync, r.bytesPerObject)
	if *memProfile != "" {
		f, err := os.Create(*memProfile)
		if err != nil {
			return r, nil, nil, err
		}
		_ = pprof.WriteHeapProfile(f)
		f.Close()
	}
	return r, e, stop, nil
}

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

// follower is one watcher of the fan-out: an engine or a plain informer.
type follower struct {
	sees func(model string) bool
	stop func()
}

// ownConfig returns cfg with a dialer of its own: a client built from it
// gets its own transport and TCP connection, as a pod would, instead of
// one more HTTP/2 stream on a connection that all followers share.
func ownConfig(cfg *rest.Config) *rest.Config {
	own := rest.CopyConfig(cfg)
	own.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return own
}

func engineFollower(ctx context.Context, cfg *rest.Config) (follower, error) {
	e, stop, err := startEngine(ownConfig(cfg))
	if err != nil {
		return follower{}, err
	}
	if err := e.WaitForSync(ctx); err != nil {
		stop()
		return follower{}, err
	}
	ix, _ := e.Index("model-to-app")
	return follower{sees: func(m string) bool { return len(ix.Lookup(m)) > 0 }, stop: stop}, nil
}

func informerFollower(ctx context.Context, cfg *rest.Config) (follower, error) {
	dyn, err := dynamic.NewForConfig(ownConfig(cfg))
	if err != nil {
		return follower{}, err
	}
	factory, inf, err := seedInformer(dyn)
	if err != nil {
		return follower{}, err
	}
	stopCh := make(chan struct{})
	stop := func() { close(stopCh); factory.Shutdown() }
	factory.Start(stopCh)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		stop()
		return follower{}, fmt.Errorf("informer did not sync")
	}
	idx := inf.GetIndexer()
	return follower{sees: func(m string) bool {
		objs, _ := idx.ByIndex("model", m)
		return len(objs) > 0
	}, stop: stop}, nil
}

// measureFanout starts *fanout followers in this process, each with its
// own watch connection, and times writes until all of them see each one.
func measureFanout(ctx context.Context, dyn dynamic.Interface, cfg *rest.Config, what string, start func(context.Context, *rest.Config) (follower, error)) (all, first percentiles, err error) {
	logf("fan-out: starting %d %s", *fanout, what)
	var fs []follower
	defer func() {
		for _, f := range fs {
			f.stop()
		}
		runtime.GC()
	}()
	for range *fanout {
		f, err := start(ctx, cfg)
		if err != nil {
			return all, first, err
		}
		fs = append(fs, f)
	}
	logf("fan-out: all %d %s synced; writing", len(fs), what)
	if *cpuProfile != "" && what == "engines" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return all, first, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return all, first, err
		}
		defer pprof.StopCPUProfile()
	}
	if *apiProfile != "" && what == "engines" {
		done := make(chan struct{})
		defer func() { <-done }()
		go func() {
			defer close(done)
			kube := kubernetes.NewForConfigOrDie(cfg)
			body, err := kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "3").DoRaw(ctx)
			if err == nil {
				err = os.WriteFile(*apiProfile, body, 0o644)
			}
			if err != nil {
				logf("fan-out: apiserver profile: %v", err)
			}
		}()
	}
	// The first follower that sees a write tells the write's own latency
	// apart from the time it takes to reach all of them.
	lat, err := latency(ctx, dyn, "fanout-"+what, *fanoutWrites, func(m string) bool {
		for _, f := range fs {
			if !f.sees(m) {
				return false
			}
		}
		return true
	}, func(m string) bool {
		for _, f := range fs {
			if f.sees(m) {
				return true
			}
		}
		return false
	})
	if err != nil {
		return all, first, err
	}
	logf("fan-out: the first of %d %s sees a write at p50 %.2f ms, p99 %.2f ms; all of them at p50 %.2f ms, p99 %.2f ms",
		len(fs), what, lat[1].p50, lat[1].p99, lat[0].p50, lat[0].p99)
	return lat[0], lat[1], nil
}

// measureHTTP drives a bare net/http handler that returns a fixed JSON body
// and the API's lookup endpoint with the same load generator.
func measureHTTP(e *msync.Engine, keys []string) (bare, lookup float64) {
	body := []byte(`{"index":"model-to-app","key":"model-000001-0","values":["app-000001"]}` + "\n")
	bareSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer bareSrv.Close()
	apiSrv := httptest.NewServer(api.New(e, quiet))
	defer apiSrv.Close()
	logf("HTTP: bare handler")
	bare = load(bareSrv.URL+"/v1/indexes/model-to-app/keys/", keys)
	logf("HTTP: metasync API")
	lookup = load(apiSrv.URL+"/v1/indexes/model-to-app/keys/", keys)
	return bare, lookup
}

func load(prefix string, keys []string) float64 {
	tr := &http.Transport{MaxIdleConnsPerHost: *httpConns, MaxConnsPerHost: *httpConns}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var total atomic.Int64
	deadline := time.Now().Add(*httpDur)
	var wg gosync.WaitGroup
	for c := range *httpConns {
		wg.Go(func() {
			i := c * 1000
			for time.Now().Before(deadline) {
				resp, err := client.Get(prefix + keys[i%len(keys)])
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				total.Add(1)
				i++
			}
		})
	}
	wg.Wait()
	return float64(total.Load()) / httpDur.Seconds()
}
