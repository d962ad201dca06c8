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
	"os"
	"runtime"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	msync "github.com/iidp/metasync/sync"
)

// Flags. Their names, defaults and help texts are the bench's interface
// (the Makefile and BENCHMARKS.md use them): keep them stable.
var (
	n               = flag.Int("n", 10000, "AppModels to create (3 models each)")
	workers         = flag.Int("workers", 16, "parallel writers while populating")
	writes          = flag.Int("writes", 1000, "writes for the write-to-visible latency")
	fanout          = flag.Int("fanout", 50, "engines in one process for the fan-out test (0: skip)")
	fanoutWrites    = flag.Int("fanout-writes", 1000, "writes for the fan-out latency")
	fanoutInformers = flag.Bool("fanout-informers", true, "also time the fan-out with as many plain informers (skipped when n × fanout > 1,000,000: memory)")
	httpDur         = flag.Duration("http", 3*time.Second, "load duration per HTTP server (0: skip)")
	httpConns       = flag.Int("http-conns", 8, "concurrent HTTP clients")
	streams         = flag.Bool("streams", true, "also time change streams (a library subscription, an HTTP stream and a gRPC resolver on each written key) and measure 1,000 open ones")
	memProfile      = flag.String("memprofile", "", "write a heap profile after metasync's sync to this file")
	cpuProfile      = flag.String("cpuprofile", "", "write a CPU profile of the fan-out writes to this file")
	apiProfile      = flag.String("apiserver-profile", "", "write the kube-apiserver's CPU profile of 3 s of fan-out writes to this file")
	verbose         = flag.Bool("v", false, "log the engine's debug lines")
	checkTargets    = flag.Bool("check", false, "exit with status 1 when a measure misses its target")
	tunedPeer       = flag.Bool("tuned", true, "also measure the tuned informer (a transform that keeps only the index's fields) for heap, sync and lookups")
	benchstatOut    = flag.String("benchstat", "", "also write every measure to this file in the Go benchmark format, for benchstat")
)

// gvr is the AppModel resource that both sides watch, in namespace ns.
var gvr = schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}

// ns is the namespace the bench creates its AppModels in.
const ns = "bench"

// row is one line of the printed table: the plain informer's measure
// (baseline) and metasync's, in unit, and the target printed beside them.
// A raw row, or one without a baseline, prints no ratio.
type row struct {
	name, unit          string
	baseline, metasync  float64
	target              target
	higherIsBetter, raw bool
	// left and right name the columns of the table the row is printed in.
	left, right string
}

// result is what one side, the plain informer or metasync, measured; run
// fills in p50 and p99 from one latency run shared by both.
type result struct {
	sync                                                  time.Duration
	bytesPerObject                                        float64
	lookupHot, lookupRandom, lookupParallel, lookupAllocs float64
	// ratioHot, ratioRandom and ratioParallel are the lookups' times over
	// a plain map's (metasync's only).
	ratioHot, ratioRandom, ratioParallel float64
	p50, p99                             float64
}

// main parses the flags and runs the bench; an error exits with status 1.
func main() {
	flag.Parse()
	if *churnFor < segment {
		fmt.Fprintf(os.Stderr, "bench: -churn-for %s: at least %s (one idle and one churning segment)\n", *churnFor, segment)
		os.Exit(2)
	}
	if *child == "engines" {
		if err := runEnginesChild(); err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		return
	}
	if *child == "bare-http" {
		fmt.Fprintln(os.Stderr, "bench child:", serveBare(*childListen))
		os.Exit(1)
	}
	if *child != "" {
		fmt.Fprintf(os.Stderr, "bench: -child %q: only engines or bare-http\n", *child)
		os.Exit(2)
	}
	var err error
	switch *only {
	case "churn":
		err = runChurnOnly() // in process: no control plane
	case "lookups":
		err = runLookupsOnly() // the same
	case "isolation":
		err = runIsolationOnly() // the same
	default:
		err = run()
	}
	if err == nil && *benchstatOut != "" {
		err = writeBenchstat(*benchstatOut)
	}
	if err == nil {
		err = check()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run starts a control plane with envtest, creates the AppModels, measures
// the plain informer and metasync on them, and prints the table to stdout.
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

	keys := benchKeys()

	if *only != "" {
		return runOnly(ctx, cfg, kube, dyn, keys)
	}
	var rows []row
	if _, _, err := rawList(ctx, cfg, 3); err != nil { // warm the apiserver's cache
		return err
	}
	// Resident memory first, each side in a process of its own, while this
	// one holds nothing yet of either.
	var rssRows []row
	if *rss {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: emptyNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		if rssRows, err = measureRSS(cfg); err != nil {
			return err
		}
	}

	listDur, syncDur, err := measureSyncs(ctx, cfg)
	if err != nil {
		return err
	}
	// The same, listed as the apiserver streams it (Options.StreamingList).
	streamedRaw, streamedSync, _, err := timeSyncs(ctx, cfg, msync.Options{StreamingList: true}, rawStreamingList)
	if err != nil {
		return err
	}
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
	// noise is the same for both. With -streams, the same writes also time
	// a library subscription and an HTTP stream of the written key.
	ix, _ := engine.Inspect().Index("model-to-app")
	probes := []probe{polled(informerSees), polled(func(m string) bool { return len(ix.Lookup(m)) > 0 })}
	var srv *streamServer
	if *streams {
		if srv, err = startStreams(cfg); err != nil {
			return err
		}
		defer srv.stop()
		probes = append(probes, libraryProbe(engine), httpProbe(srv), resolverProbe(engine))
	}
	ds, err := timeWrites(ctx, dyn, "write", *writes, probes...)
	if err != nil {
		return err
	}
	lat := summarize(ds)
	base.p50, base.p99, ms.p50, ms.p99 = lat[0].p50, lat[0].p99, lat[1].p50, lat[1].p99
	stopInformer()
	runtime.GC()
	var tuned result
	if *tunedPeer {
		if tuned, err = measureTunedInformer(dyn, keys); err != nil {
			return err
		}
		runtime.GC()
	}
	floorHot, floorRandom := lookupsVsMap(keys, ix, &ms)

	rows = append(rows,
		row{name: "heap per indexed object", unit: "B", baseline: base.bytesPerObject, metasync: ms.bytesPerObject, target: ratioAtMost(1.0/20, "≤ 1/20")},
		row{name: "initial sync (metasync: median of 5)", unit: "s", baseline: base.sync.Seconds(), metasync: ms.sync.Seconds(), target: atMost(1.3*listDur.Seconds(), "≤ 1.3 × raw LIST")},
		row{name: "raw LIST, bytes only (median of 5)", unit: "s", baseline: listDur.Seconds(), metasync: listDur.Seconds(), raw: true},
		row{name: "initial sync, streaming list (median of 5)", unit: "s", baseline: base.sync.Seconds(), metasync: streamedSync.Seconds(), target: atMost(1.3*listDur.Seconds(), "≤ 1.3 × raw LIST")},
		row{name: "raw streaming list, bytes only (median of 5)", unit: "s", baseline: streamedRaw.Seconds(), metasync: streamedRaw.Seconds(), raw: true},
	)
	rows = append(rows, lookupRows(base, ms, floorHot, floorRandom)...)
	rows = append(rows,
		row{name: "write → visible p50", unit: "ms", baseline: base.p50, metasync: ms.p50},
		row{name: "write → visible p99", unit: "ms", baseline: base.p99, metasync: ms.p99, target: atMost(base.p99+1, "≤ informer + 1 ms")},
	)
	rows = append(rows, rssRows...)
	var streamSummary string
	if *streams {
		more, summary, err := streamRows(ctx, engine, srv, keys, ds, lat, ms)
		if err != nil {
			return err
		}
		srv.stop() // its watch would load the rows that follow
		rows, streamSummary = append(rows, more...), summary
	}
	live, total, err := measureRelist(ctx, cfg)
	if err != nil {
		return err
	}
	rows = append(rows,
		row{name: "relist: peak live heap / steady", unit: "x", metasync: live, target: atMost(2, "≤ 2")},
		row{name: "relist: peak heap with garbage / steady", unit: "x", metasync: total})
	if *fanout > 0 {
		more, err := fanoutRows(ctx, dyn, cfg, base, ms)
		if err != nil {
			return err
		}
		rows = append(rows, more...)
	}
	if *httpDur > 0 {
		bare, lookup, err := measureHTTP(cfg, keys)
		if err != nil {
			return err
		}
		rows = append(rows, row{name: "HTTP lookups/s (bare net/http vs API)", unit: "req/s", baseline: bare, metasync: lookup, target: ratioAtLeast(0.7, "≥ 70 %"), higherIsBetter: true})
	}
	stopEngine()

	printTable(fmt.Sprintf("metasync vs plain dynamic informer — %d AppModels (3 models each), kube-apiserver v1.37.2, %d CPUs, %s", *n, runtime.NumCPU(), runtime.Version()),
		"informer", "metasync", rows)
	fmt.Printf("\ninitial sync / raw LIST: informer %.2f, metasync %.2f (target ≤ 1.30)\n", base.sync.Seconds()/listDur.Seconds(), ms.sync.Seconds()/listDur.Seconds())
	fmt.Printf("lookup / plain map (median of the rounds' pairs): hot %.2f, random %.2f, parallel %.2f (target ≤ 1.20)\n", ms.ratioHot, ms.ratioRandom, ms.ratioParallel)
	fmt.Printf("memory: metasync uses 1/%.1f of the informer's heap per object (target ≥ 20)\n", base.bytesPerObject/ms.bytesPerObject)
	fmt.Print(streamSummary)
	if *tunedPeer {
		tunedRows := []row{{name: "tuned: heap per indexed object", unit: "B", baseline: tuned.bytesPerObject, metasync: ms.bytesPerObject}}
		if tunedRSS > 0 {
			tunedRows = append(tunedRows, row{name: "tuned: resident memory per object", unit: "B", baseline: tunedRSS, metasync: metasyncRSS(rssRows), target: ratioAtMost(1.0/12, "≤ 1/12")})
		}
		printTable(fmt.Sprintf("metasync vs the tuned informer (a transform keeps name, namespace, resourceVersion, spec.models) — %d AppModels", *n),
			"tuned", "metasync", append(tunedRows, []row{
				{name: "tuned: initial sync", unit: "s", baseline: tuned.sync.Seconds(), metasync: ms.sync.Seconds(), target: atMost(1.3*listDur.Seconds(), "≤ 1.3 × raw LIST")},
				{name: "tuned: lookup, hot key", unit: "ns", baseline: tuned.lookupHot, metasync: ms.lookupHot},
				{name: "tuned: lookup, random keys", unit: "ns", baseline: tuned.lookupRandom, metasync: ms.lookupRandom},
				{name: "tuned: lookup, random, 2 goroutines", unit: "ns", baseline: tuned.lookupParallel, metasync: ms.lookupParallel},
				{name: "tuned: lookup allocs", unit: "allocs", baseline: tuned.lookupAllocs, metasync: ms.lookupAllocs},
			}...))
		fmt.Printf("memory: metasync uses 1/%.1f of the tuned informer's heap per object\n", tuned.bytesPerObject/ms.bytesPerObject)
	}
	if *churnRate > 0 {
		rows, err := churnLookupRows(keys)
		if err != nil {
			return err
		}
		printTable(fmt.Sprintf("lookups while a writer applies %d events/s, each lookup timed — %d AppModels, in process", *churnRate, *n),
			"indexer", "metasync", rows)
	}
	if *isolationWrites > 0 {
		rows, err := isolationRows()
		if err != nil {
			return err
		}
		printTable(isolationTitle(), "idle", "busy", rows)
	}
	if *rss && *churn {
		// Last: the churn leaves the AppModels changed.
		rows, err := measureChurn(ctx, cfg, dyn)
		if err != nil {
			return err
		}
		printTable(fmt.Sprintf("resident memory after churn — %d AppModels, %d writes", *n, *n+*n/10), "before", "after", rows)
	}
	if *warm {
		if err := runWarm(ctx, cfg, kube, dyn, keys); err != nil {
			return err
		}
	}
	return nil
}

// metasyncRSS is metasync's resident memory per object in the rows of
// measureRSS (0 without them).
func metasyncRSS(rows []row) float64 {
	for _, r := range rows {
		if strings.HasPrefix(r.name, "resident memory per object") {
			return r.metasync
		}
	}
	return 0
}

// runWarm measures and prints the warm start rows.
func runWarm(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, dyn dynamic.Interface, keys []string) error {
	runtime.GC()
	rows, err := measureWarm(ctx, cfg, kube, keys)
	if err != nil {
		return err
	}
	if *rollout > 0 {
		more, err := measureRollout(ctx, cfg, kube, dyn)
		if err != nil {
			return err
		}
		rows = append(rows, more...)
	}
	printTable(fmt.Sprintf("warm start — %d AppModels, `metasync serve --snapshot-dir`, kube-apiserver v1.37.2, %d CPUs", *n, runtime.NumCPU()),
		"cold", "warm", rows)
	return nil
}

// printTable prints rows as a Markdown table whose value columns are
// called left and right.
func printTable(title, left, right string, rows []row) {
	fmt.Printf("\n%s\n\n", title)
	width := 40
	for _, r := range rows {
		width = max(width, utf8.RuneCountInString(r.name))
	}
	fmt.Printf("| %-*s | %14s | %14s | %8s | %-20s |\n", width, "measure", left, right, "ratio", "target")
	fmt.Printf("|%s|%s|%s|%s|%s|\n", dashes(width+2), dashes(16), dashes(16), dashes(10), dashes(22))
	for _, r := range rows {
		rs := fmt.Sprintf("%.2f", r.metasync/r.baseline)
		if r.raw || r.baseline == 0 {
			rs = "—"
		}
		t := r.target.text
		if r.missed() {
			t += " MISSED"
		}
		fmt.Printf("| %-*s | %14s | %14s | %8s | %-20s |\n", width, r.name, format(r.baseline, r.unit), format(r.metasync, r.unit), rs, t)
		r.left, r.right = left, right
		report = append(report, r)
	}
}

// dashes returns n dashes, for the table's separator line.
func dashes(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = '-'
	}
	return string(b)
}

// format renders v in unit for one cell of the table.
func format(v float64, unit string) string {
	switch unit {
	case "B":
		if v == 0 {
			return "—"
		}
		return fmt.Sprintf("%.0f B", v)
	case "s":
		return fmt.Sprintf("%.3f s", v)
	case "ns":
		return fmt.Sprintf("%.1f ns", v)
	case "MiB":
		return fmt.Sprintf("%.1f MiB", v)
	case "µs":
		return fmt.Sprintf("%.1f µs", v)
	case "ms":
		if v == 0 {
			return "—" // not measured on this side
		}
		return fmt.Sprintf("%.2f ms", v)
	case "allocs":
		return fmt.Sprintf("%.0f", v)
	case "count":
		if v == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", v)
	case "req/s":
		return fmt.Sprintf("%.0f/s", v)
	case "MB":
		return fmt.Sprintf("%.2f MB", v)
	case "x":
		if v == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprint(v)
}

// runOnly runs the row group that -only names: warm, rss, sync or relist.
func runOnly(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, dyn dynamic.Interface, keys []string) error {
	switch *only {
	case "warm":
		return runWarm(ctx, cfg, kube, dyn, keys)
	case "rss":
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: emptyNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		rows, err := measureRSS(cfg)
		if err != nil {
			return err
		}
		if *churn {
			more, err := measureChurn(ctx, cfg, dyn)
			if err != nil {
				return err
			}
			rows = append(rows, more...)
		}
		printTable(fmt.Sprintf("resident memory — %d AppModels, %d CPUs", *n, runtime.NumCPU()), "informer", "metasync", rows)
		return nil
	case "relist":
		live, total, err := measureRelist(ctx, cfg)
		if err != nil {
			return err
		}
		printTable(fmt.Sprintf("relist — %d AppModels, %d CPUs", *n, runtime.NumCPU()), "—", "metasync", []row{
			{name: "relist: peak live heap / steady", unit: "x", metasync: live, target: atMost(2, "≤ 2")},
			{name: "relist: peak heap with garbage / steady", unit: "x", metasync: total, raw: true},
		})
		return nil
	case "sync":
		listDur, syncDur, _, err := timeSyncs(ctx, cfg, msync.Options{}, rawList)
		if err != nil {
			return err
		}
		streamedRaw, streamedSync, _, err := timeSyncs(ctx, cfg, msync.Options{StreamingList: true}, rawStreamingList)
		if err != nil {
			return err
		}
		printTable(fmt.Sprintf("initial sync — %d AppModels, %d CPUs", *n, runtime.NumCPU()), "raw", "metasync", []row{
			{name: "initial sync, LIST (median of 5)", unit: "s", baseline: listDur.Seconds(), metasync: syncDur.Seconds(), target: atMost(1.3*listDur.Seconds(), "≤ 1.3 × raw LIST")},
			{name: "initial sync, streaming list (median of 5)", unit: "s", baseline: streamedRaw.Seconds(), metasync: streamedSync.Seconds(), target: atMost(1.3*listDur.Seconds(), "≤ 1.3 × raw LIST")},
			{name: "raw streaming list / raw LIST", unit: "x", metasync: streamedRaw.Seconds() / listDur.Seconds(), raw: true},
		})
		return nil
	}
	return fmt.Errorf("-only %q: warm, rss, sync, relist, churn, lookups or isolation", *only)
}

// measureSyncs times the initial sync against a raw LIST, interleaved,
// median of 5 each, before the informer starts: its heap (half a gigabyte
// at 100,000 objects) would slow down every garbage collection of the
// syncs.
func measureSyncs(ctx context.Context, cfg *rest.Config) (listDur, syncDur time.Duration, err error) {
	listDur, syncDur, _, err = timeSyncs(ctx, cfg, msync.Options{}, rawList)
	return listDur, syncDur, err
}

// timeSyncs times, 5 times interleaved, a raw list (rawList or
// rawStreamingList) and the initial sync of an engine with opts, and
// returns their medians and the raw list's size.
func timeSyncs(ctx context.Context, cfg *rest.Config, opts msync.Options, raw func(context.Context, *rest.Config, int) (time.Duration, int, error)) (listDur, syncDur time.Duration, size int, err error) {
	var syncs, lists []time.Duration
	for range 5 {
		d, n, err := raw(ctx, cfg, 1)
		if err != nil {
			return 0, 0, 0, err
		}
		lists, size = append(lists, d), n
		e, stop, err := startEngineWith(cfg, opts)
		if err != nil {
			return 0, 0, 0, err
		}
		start := time.Now()
		if err := e.WaitForSync(ctx); err != nil {
			return 0, 0, 0, err
		}
		syncs = append(syncs, time.Since(start))
		stop()
		runtime.GC() // the next run starts without this one's garbage
	}
	listDur, syncDur = median(lists), median(syncs)
	logf("raw list %v (median %s, %d bytes); metasync sync %v (median %s), streaming %v", lists, listDur, size, syncs, syncDur, opts.StreamingList)
	return listDur, syncDur, size, nil
}

// streamRows are the rows of the change streams: the subscribers' latency
// against metasync's own write → visible, and the cost of open streams.
func streamRows(ctx context.Context, engine *msync.Engine, srv *streamServer, keys []string, ds [][]float64, lat []percentiles, ms result) ([]row, string, error) {
	// The subscribers against metasync's own write -> visible, and per
	// write: each one's notification less the poll's finding.
	libLate, httpLate := make([]float64, len(ds[1])), make([]float64, len(ds[1]))
	for w, v := range ds[1] {
		libLate[w], httpLate[w] = ds[2][w]-v, ds[3][w]-v
	}
	l, h := pct(libLate), pct(httpLate)
	rows := []row{
		{name: "write → subscriber notified (library) p50", unit: "ms", metasync: lat[2].p50},
		row{name: "write → subscriber notified (library) p99", unit: "ms", metasync: lat[2].p99, target: atMost(ms.p99+1, "≤ visible + 1 ms")},
		row{name: "write → subscriber notified (HTTP stream) p50", unit: "ms", metasync: lat[3].p50},
		row{name: "write → subscriber notified (HTTP stream) p99", unit: "ms", metasync: lat[3].p99, target: atMost(ms.p99+2, "≤ visible + 2 ms")},
		row{name: "write → gRPC resolver UpdateState p50", unit: "ms", metasync: lat[4].p50},
		row{name: "write → gRPC resolver UpdateState p99", unit: "ms", metasync: lat[4].p99},
	}
	open := min(1000, len(keys))
	lib, stream, err := measureOpenStreams(ctx, engine, srv, keys, open)
	if err != nil {
		return nil, "", err
	}
	rows = append(rows,
		row{name: fmt.Sprintf("heap per key subscription (%d open)", open), unit: "B", metasync: lib.heap},
		row{name: fmt.Sprintf("daemon resident per idle HTTP stream (%d open)", open), unit: "B", metasync: stream.heap},
		row{name: "stacks per idle HTTP stream", unit: "B", metasync: stream.stacks},
		row{name: "goroutines per idle HTTP stream", unit: "count", metasync: stream.goroutines},
	)
	summary := fmt.Sprintf("change streams: notified p99 − write → visible p99: library %+.2f ms (target ≤ +1), HTTP %+.2f ms (target ≤ +2); "+
		"per write, notified − visible: library p50 %+.2f, p99 %+.2f ms; HTTP p50 %+.2f, p99 %+.2f ms\n",
		lat[2].p99-ms.p99, lat[3].p99-ms.p99, l.p50, l.p99, h.p50, h.p99)
	return rows, summary, nil
}

// fanoutRows are the rows of the fan-out: as many engines (and plain
// informers) in one process, all seeing each write.
func fanoutRows(ctx context.Context, dyn dynamic.Interface, cfg *rest.Config, base, ms result) ([]row, error) {
	engines, _, err := measureFanout(ctx, dyn, cfg, "engines", engineFollower)
	if err != nil {
		return nil, err
	}
	var informers percentiles
	if *fanoutInformers && *n**fanout <= 1_000_000 {
		if informers, _, err = measureFanout(ctx, dyn, cfg, "informers", informerFollower); err != nil {
			return nil, err
		}
	} else {
		logf("fan-out: %d plain informers skipped", *fanout)
	}
	return []row{
		{name: fmt.Sprintf("fan-out: %d of each, p50 all see", *fanout), unit: "ms", baseline: informers.p50, metasync: engines.p50},
		row{name: fmt.Sprintf("fan-out: %d of each, p99 all see", *fanout), unit: "ms", baseline: informers.p99, metasync: engines.p99},
		row{name: "fan-out p50 / one's write → visible p50", unit: "x", baseline: informers.p50 / base.p50, metasync: engines.p50 / ms.p50, raw: true},
		row{name: "fan-out p99 / one's write → visible p99", unit: "x", baseline: informers.p99 / base.p99, metasync: engines.p99 / ms.p99, raw: true, target: atMost(2, "≤ 2")},
	}, nil
}
