// Warm start: `metasync serve --snapshot-dir` restarted cold (no snapshot)
// against warm (the snapshot of its last run), timed from the process's
// start to its first correct answer and to /readyz; the LISTs and bytes the
// apiserver served for each restart, from the apiserver's own metrics; the
// cost of writing a snapshot and the lookups meanwhile; and a rolling
// restart of many engines (-rollout), cold against warm.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

var (
	warm           = flag.Bool("warm", true, "time restarts of `metasync serve --snapshot-dir` cold against warm (-metasync), and a snapshot write")
	warmRuns       = flag.Int("warm-runs", 3, "cold and warm restarts each, for medians")
	rollout        = flag.Int("rollout", 200, "engines in the rolling-restart estimate, cold against warm (0: skip)")
	rolloutProcs   = flag.Int("rollout-procs", 4, "processes the rollout's engines are spread over")
	rolloutObjects = flag.Int("rollout-objects", 1000, "small AppModels that each rollout engine watches")
	serveLog       = flag.String("serve-log-level", "warn", "--log-level of the `metasync serve` runs")
	only           = flag.String("only", "", `"warm", "rss", "sync" or "relist": run the warm start, resident memory, initial sync or relist rows only (after populating); "churn", "lookups" or "isolation": the lookups-under-churn, lookups-against-a-map or one-resource's-writes-while-another-is-busy rows (in process, no control plane)`)
	childEngines   = flag.Int("child-engines", 0, "internal: engines of a rollout child")
	childSnapshots = flag.String("child-snapshots", "", "internal: snapshot folders' root of a rollout child")
	childFirst     = flag.Int("child-first", 0, "internal: number of the child's first engine")
	childStreaming = flag.Bool("child-streaming", false, "internal: the rollout child's engines list as the apiserver streams it (Options.StreamingList)")
	childAuto      = flag.Bool("child-auto", false, "internal: the rollout child's engines stream the lists of resources watched whole (Options.StreamingListAuto)")
	childWhole     = flag.Bool("child-whole", false, "internal: the rollout child's engines watch the whole resource: no namespace, no label selector")
	rolloutWhole   = flag.Bool("rollout-whole", true, "with -rollout: also start the engines cold watching the whole resource, with Options.StreamingListAuto and then with LIST")
	wholeOnly      = flag.Bool("rollout-whole-only", false, "with -rollout: only the whole-resource phases, on an apiserver that served no other rollout")
	wholeListFirst = flag.Bool("rollout-whole-list-first", false, "with -rollout: the whole-resource phase with LIST first (each phase's peak is measured over what the apiserver held before it, and a heap grown by an earlier phase makes a later one's look smaller)")
)

// rolloutNS holds the rollout's small AppModels.
const rolloutNS = "bench-rollout"

// apiCounts are counters of the apiserver, from its /metrics.
type apiCounts struct{ lists, listBytes, cpu float64 }

func (a apiCounts) minus(b apiCounts) apiCounts {
	return apiCounts{a.lists - b.lists, a.listBytes - b.listBytes, a.cpu - b.cpu}
}

// apiserverCounts reads the LIST requests of AppModels, the bytes their
// answers held, and the apiserver's CPU seconds.
func apiserverCounts(ctx context.Context, kube kubernetes.Interface) (apiCounts, error) {
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apiCounts{}, err
	}
	var c apiCounts
	for _, line := range strings.Split(string(raw), "\n") {
		name, rest, ok := strings.Cut(line, "{")
		if !ok {
			if v, ok := strings.CutPrefix(line, "process_cpu_seconds_total "); ok {
				c.cpu, _ = strconv.ParseFloat(v, 64)
			}
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		if !strings.Contains(labels, `verb="LIST"`) || !strings.Contains(labels, `resource="appmodels"`) {
			continue
		}
		v, _ := strconv.ParseFloat(value, 64)
		switch name {
		case "apiserver_request_total":
			c.lists += v
		case "apiserver_response_sizes_sum":
			c.listBytes += v
		}
	}
	return c, nil
}

// restart is one measured start of `metasync serve`.
type restart struct {
	first, ready time.Duration
	api          apiCounts
	stale        bool // the first correct answer was marked stale
}

// serveOnce starts `metasync serve` with the snapshot folder, times its
// first correct answer for key and its /readyz, then stops it with SIGTERM
// (which writes the snapshot) and returns what the apiserver served.
func serveOnce(ctx context.Context, kube kubernetes.Interface, config, kubeconfig, addr, dir, key, want string) (restart, error) {
	var r restart
	before, err := apiserverCounts(ctx, kube)
	if err != nil {
		return r, err
	}
	cmd := exec.Command(*metasyncBin, "serve", "--config", config, "--kubeconfig", kubeconfig, "--log-level", *serveLog,
		"--snapshot-dir", dir, "--snapshot-interval", "1h")
	cmd.Stderr = os.Stderr
	client := &http.Client{Timeout: time.Second}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	url := "http://" + addr + "/v1/indexes/model-to-app/keys/" + key
	for r.first == 0 {
		if time.Since(start) > 5*time.Minute {
			return r, errors.New("no correct answer after 5 minutes")
		}
		resp, err := client.Get(url)
		if err != nil {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		var ans struct {
			Values []string `json:"values"`
			Stale  bool     `json:"stale"`
		}
		err = json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		if err == nil && slices.Equal(ans.Values, []string{want}) {
			r.first, r.stale = time.Since(start), ans.Stale
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	for {
		if time.Since(start) > 5*time.Minute {
			return r, errors.New("not ready after 5 minutes")
		}
		resp, err := client.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				r.ready = time.Since(start)
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return r, err
	}
	if err := cmd.Wait(); err != nil {
		return r, fmt.Errorf("metasync serve: %w", err)
	}
	after, err := apiserverCounts(ctx, kube)
	if err != nil {
		return r, err
	}
	r.api = after.minus(before)
	return r, nil
}

// measureWarm returns the warm start rows.
func measureWarm(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, keys []string) ([]row, error) {
	if _, err := os.Stat(*metasyncBin); err != nil {
		return nil, fmt.Errorf("-metasync %s: %w (make bench builds it)", *metasyncBin, err)
	}
	dir, kubeconfig, err := workDir(cfg, "bench-warm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	config, addr, err := serveConfig(dir, ns)
	if err != nil {
		return nil, err
	}
	snapDir := filepath.Join(dir, "snapshot")
	// The answer to wait for: the last AppModel's, whichever order the
	// list comes in.
	key, want := model(*n-1, 0), fmt.Sprintf("app-%06d", *n-1)
	var cold, warmed []restart
	for i := range *warmRuns {
		if err := os.RemoveAll(snapDir); err != nil {
			return nil, err
		}
		c, err := serveOnce(ctx, kube, config, kubeconfig, addr, snapDir, key, want)
		if err != nil {
			return nil, fmt.Errorf("cold start %d: %w", i, err)
		}
		w, err := serveOnce(ctx, kube, config, kubeconfig, addr, snapDir, key, want)
		if err != nil {
			return nil, fmt.Errorf("warm start %d: %w", i, err)
		}
		logf("warm: cold first answer %s, ready %s, %v LISTs, %.1f MB, apiserver CPU %.2f s; warm first answer %s (stale %v), ready %s, %v LISTs, %.1f MB, apiserver CPU %.2f s",
			c.first.Round(time.Millisecond), c.ready.Round(time.Millisecond), c.api.lists, c.api.listBytes/1e6, c.api.cpu,
			w.first.Round(time.Millisecond), w.stale, w.ready.Round(time.Millisecond), w.api.lists, w.api.listBytes/1e6, w.api.cpu)
		cold, warmed = append(cold, c), append(warmed, w)
	}
	med := func(rs []restart, f func(restart) time.Duration) float64 {
		ds := make([]time.Duration, len(rs))
		for i, r := range rs {
			ds[i] = f(r)
		}
		return median(ds).Seconds()
	}
	maxOf := func(rs []restart, f func(restart) float64) float64 {
		m := 0.0
		for _, r := range rs {
			m = max(m, f(r))
		}
		return m
	}
	rows := []row{
		{name: "restart → first correct lookup (cold | warm, median)", unit: "s", baseline: med(cold, func(r restart) time.Duration { return r.first }), metasync: med(warmed, func(r restart) time.Duration { return r.first }), target: ratioAtMost(0.1, "warm ≤ 1/10 of cold")},
		{name: "restart → /readyz 200 (cold | warm, median)", unit: "s", baseline: med(cold, func(r restart) time.Duration { return r.ready }), metasync: med(warmed, func(r restart) time.Duration { return r.ready }), raw: true},
		{name: "LISTs served for a restart (cold | warm, most)", unit: "", baseline: maxOf(cold, func(r restart) float64 { return r.api.lists }), metasync: maxOf(warmed, func(r restart) float64 { return r.api.lists }), target: atMost(0, "warm: 0"), raw: true},
		{name: "LIST bytes served for a restart (cold | warm, most)", unit: "MB", baseline: maxOf(cold, func(r restart) float64 { return r.api.listBytes / 1e6 }), metasync: maxOf(warmed, func(r restart) float64 { return r.api.listBytes / 1e6 }), raw: true},
		{name: "apiserver CPU for a restart (cold | warm, median)", unit: "s", baseline: med(cold, func(r restart) time.Duration { return time.Duration(r.api.cpu * 1e9) }), metasync: med(warmed, func(r restart) time.Duration { return time.Duration(r.api.cpu * 1e9) }), raw: true},
	}
	more, err := snapshotWrite(ctx, cfg, keys, dir)
	if err != nil {
		return nil, err
	}
	return append(rows, more...), nil
}

// snapshotWrite times WriteSnapshot on a synced engine, and lookups by
// random keys while none is written and while one is written without a
// pause.
func snapshotWrite(ctx context.Context, cfg *rest.Config, keys []string, dir string) ([]row, error) {
	e, stop, err := startEngine(cfg)
	if err != nil {
		return nil, err
	}
	defer stop()
	if err := e.WaitForSync(ctx); err != nil {
		return nil, err
	}
	write := func() (time.Duration, int64, error) {
		f, err := os.Create(filepath.Join(dir, "bench-snapshot"))
		if err != nil {
			return 0, 0, err
		}
		defer f.Close()
		bw := bufio.NewWriterSize(f, 256<<10)
		start := time.Now()
		if _, err := e.Inspect().WriteSnapshot(bw); err != nil {
			return 0, 0, err
		}
		if err := bw.Flush(); err != nil {
			return 0, 0, err
		}
		if err := f.Sync(); err != nil {
			return 0, 0, err
		}
		d := time.Since(start)
		st, err := f.Stat()
		if err != nil {
			return 0, 0, err
		}
		return d, st.Size(), nil
	}
	var durs []time.Duration
	var size int64
	for range 5 {
		d, s, err := write()
		if err != nil {
			return nil, err
		}
		durs, size = append(durs, d), s
	}
	ix, _ := e.Inspect().Index("model-to-app")
	// Nanoseconds per lookup, in batches of 1,000, for 2 s.
	batches := func() []time.Duration {
		rng := rand.New(rand.NewPCG(1, 2))
		var out []time.Duration
		end := time.Now().Add(2 * time.Second)
		for time.Now().Before(end) {
			start := time.Now()
			for range 1000 {
				_ = ix.Lookup(keys[rng.IntN(len(keys))])
			}
			out = append(out, time.Since(start)/1000)
		}
		slices.Sort(out)
		return out
	}
	idle := batches()
	var writing atomic.Bool
	writing.Store(true)
	var wg gosync.WaitGroup
	var writeErr error
	writes := 0
	wg.Go(func() {
		for writing.Load() {
			if _, _, err := write(); err != nil {
				writeErr = err
				return
			}
			writes++
		}
	})
	busy := batches()
	writing.Store(false)
	wg.Wait()
	if writeErr != nil {
		return nil, writeErr
	}
	pct := func(ds []time.Duration, p float64) float64 {
		return float64(ds[int(float64(len(ds)-1)*p)].Nanoseconds())
	}
	logf("snapshot: write %v (median %s), %d bytes; lookups idle p50 %.0f ns p99 %.0f ns, during %d writes p50 %.0f ns p99 %.0f ns",
		durs, median(durs), size, pct(idle, .5), pct(idle, .99), writes, pct(busy, .5), pct(busy, .99))
	return []row{
		{name: "snapshot write (median of 5, fsync included)", unit: "s", baseline: median(durs).Seconds(), metasync: median(durs).Seconds(), raw: true},
		{name: "snapshot size", unit: "MB", baseline: float64(size) / 1e6, metasync: float64(size) / 1e6, raw: true},
		{name: "lookup p50, idle | while snapshots are written", unit: "ns", baseline: pct(idle, .5), metasync: pct(busy, .5), raw: true},
		{name: "lookup p99, idle | while snapshots are written", unit: "ns", baseline: pct(idle, .99), metasync: pct(busy, .99), raw: true},
	}, nil
}

// measureRollout restarts -rollout engines spread over -rollout-procs
// processes, each watching -rollout-objects small AppModels with its own
// snapshot folder: once cold, once warm.
func measureRollout(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, dyn dynamic.Interface) ([]row, error) {
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rolloutNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	err := inParallel(*rolloutObjects, func(i int) error {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "iidp.com/v1", "kind": "AppModel",
			"metadata": map[string]any{"name": fmt.Sprintf("r-%05d", i), "labels": map[string]any{"iidp": "iidp"}},
			"spec":     map[string]any{"type": "model", "version": "1", "models": []any{fmt.Sprintf("rm-%05d", i)}},
		}}
		_, err := dyn.Resource(gvr).Namespace(rolloutNS).Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "bench", Force: true})
		return err
	})
	if err != nil {
		return nil, err
	}
	dir, kubeconfig, err := workDir(cfg, "bench-rollout-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	api := apiserverProcess()
	// phase starts the engines, listing as l says, and returns what the
	// apiserver served, its peak resident memory over what it held
	// before, and how long until every engine caught up.
	phase := func(what string, l listing, snapshots string) (apiCounts, float64, time.Duration, error) {
		before, err := apiserverCounts(ctx, kube)
		if err != nil {
			return apiCounts{}, 0, 0, err
		}
		rss0 := api.resetPeak()
		start := time.Now()
		per := (*rollout + *rolloutProcs - 1) / *rolloutProcs
		var cmds []*exec.Cmd
		var lines []chan string
		for p := 0; p*per < *rollout; p++ {
			k := min(per, *rollout-p*per)
			cmd := exec.Command(os.Args[0], "-child", "engines", "-child-kubeconfig", kubeconfig, "-child-namespace", rolloutNS,
				"-child-engines", strconv.Itoa(k), "-child-first", strconv.Itoa(p*per), "-child-snapshots", snapshots, fmt.Sprintf("-child-streaming=%t", l.streaming), fmt.Sprintf("-child-auto=%t", l.auto), fmt.Sprintf("-child-whole=%t", l.whole))
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				return apiCounts{}, 0, 0, err
			}
			if err := cmd.Start(); err != nil {
				return apiCounts{}, 0, 0, err
			}
			ch := make(chan string, 1)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					ch <- sc.Text()
				}
				close(ch)
			}()
			cmds, lines = append(cmds, cmd), append(lines, ch)
		}
		for i, ch := range lines {
			if l := <-ch; !strings.HasPrefix(l, "synced") {
				return apiCounts{}, 0, 0, fmt.Errorf("rollout child %d: %q", i, l)
			}
		}
		took := time.Since(start)
		peak := api.peak() - rss0
		for _, cmd := range cmds {
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				return apiCounts{}, 0, 0, fmt.Errorf("rollout child: %w", err)
			}
		}
		after, err := apiserverCounts(ctx, kube)
		if err != nil {
			return apiCounts{}, 0, 0, err
		}
		d := after.minus(before)
		logf("rollout %s: %d engines in %d processes synced in %s: %v LISTs, %.1f MB, apiserver CPU %.2f s, apiserver peak resident +%.1f MiB over %.1f MiB",
			what, *rollout, len(cmds), took.Round(time.Millisecond), d.lists, d.listBytes/1e6, d.cpu, peak/(1<<20), rss0/(1<<20))
		return d, peak, took, nil
	}
	var rows []row
	if !*wholeOnly {
		// The streaming lists' cold start first, on the apiserver as fresh as
		// it is here: the LISTs' then start from an apiserver whose heap has
		// grown for the first, which can only make their peak look smaller.
		streamed, streamedPeak, streamedTook, err := phase("cold, streaming lists", listing{streaming: true}, filepath.Join(dir, "snapshots-streaming"))
		if err != nil {
			return nil, err
		}
		snapshots := filepath.Join(dir, "snapshots")
		cold, coldPeak, coldTook, err := phase("cold", listing{}, snapshots)
		if err != nil {
			return nil, err
		}
		warmed, warmPeak, warmTook, err := phase("warm", listing{}, snapshots)
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("rollout of %d engines, %d objects each (cold | warm): ", *rollout, *rolloutObjects)
		streaming := fmt.Sprintf("rollout of %d engines, cold (LIST | streaming list): ", *rollout)
		rows = []row{
			{name: name + "LISTs", baseline: cold.lists, metasync: warmed.lists, raw: true},
			{name: name + "LIST bytes", unit: "MB", baseline: cold.listBytes / 1e6, metasync: warmed.listBytes / 1e6, raw: true},
			{name: name + "apiserver CPU", unit: "s", baseline: cold.cpu, metasync: warmed.cpu, raw: true},
			{name: name + "all caught up", unit: "s", baseline: coldTook.Seconds(), metasync: warmTook.Seconds(), raw: true},
		}
		if api.pid != 0 {
			rows = append(rows, row{name: name + "apiserver peak memory", unit: "MiB", baseline: coldPeak / (1 << 20), metasync: warmPeak / (1 << 20), raw: true})
		}
		rows = append(rows,
			row{name: streaming + "apiserver CPU", unit: "s", baseline: cold.cpu, metasync: streamed.cpu, raw: true},
			row{name: streaming + "all caught up", unit: "s", baseline: coldTook.Seconds(), metasync: streamedTook.Seconds(), raw: true})
		if api.pid != 0 {
			rows = append(rows, row{name: streaming + "apiserver peak memory", unit: "MiB", baseline: coldPeak / (1 << 20), metasync: streamedPeak / (1 << 20), target: ratioAtMost(0.5, "≤ 0.5 × LIST")})
		}
	}
	if !*rolloutWhole && !*wholeOnly {
		return rows, nil
	}
	// The engines watching the whole resource (every AppModel of the
	// cluster), cold: with StreamingListAuto, which streams such lists,
	// and with LISTs, on an apiserver grown by the phases before.
	var auto, whole apiCounts
	var autoPeak, wholePeak float64
	var autoTook, wholeTook time.Duration
	for i := range 2 {
		var err error
		if (i == 0) == *wholeListFirst {
			whole, wholePeak, wholeTook, err = phase("cold, whole resource, LIST", listing{whole: true}, filepath.Join(dir, "snapshots-whole"))
		} else {
			auto, autoPeak, autoTook, err = phase("cold, whole resource, auto", listing{auto: true, whole: true}, filepath.Join(dir, "snapshots-whole-auto"))
		}
		if err != nil {
			return nil, err
		}
	}
	name := fmt.Sprintf("rollout of %d engines, whole resource, cold (LIST | auto): ", *rollout)
	rows = append(rows,
		row{name: name + "LISTs", baseline: whole.lists, metasync: auto.lists, raw: true},
		row{name: name + "apiserver CPU", unit: "s", baseline: whole.cpu, metasync: auto.cpu, raw: true},
		row{name: name + "all caught up", unit: "s", baseline: wholeTook.Seconds(), metasync: autoTook.Seconds(), raw: true})
	if api.pid != 0 {
		rows = append(rows, row{name: name + "apiserver peak memory", unit: "MiB", baseline: wholePeak / (1 << 20), metasync: autoPeak / (1 << 20), target: ratioAtMost(0.5, "≤ 0.5 × LIST")})
	}
	return rows, nil
}

// listing is how a rollout phase's engines list: streamed
// (Options.StreamingList), auto (Options.StreamingListAuto), and whether
// they watch the whole resource rather than the rollout's namespace with
// a label selector.
type listing struct{ streaming, auto, whole bool }

// apiserverProc is the kube-apiserver that envtest started, a child of
// this process, read in /proc (pid 0: not found; its reads are then 0).
type apiserverProc struct{ pid int }

// apiserverProcess finds this process's kube-apiserver child.
func apiserverProcess() apiserverProc {
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if s[open+1:end] == "kube-apiserver" && len(fields) > 1 && fields[1] == self {
			// Its peak is measured by resetting it: that takes the
			// right to write the process's clear_refs.
			if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
				logf("rollout: the kube-apiserver's peak memory cannot be reset (%v): it is not measured", err)
				return apiserverProc{}
			}
			return apiserverProc{pid: pid}
		}
	}
	logf("rollout: no kube-apiserver child found: its memory is not measured")
	return apiserverProc{}
}

// resetPeak makes the kernel's peak resident memory (VmHWM) of the
// apiserver its current one (clear_refs 5), and returns it.
func (p apiserverProc) resetPeak() float64 {
	if p.pid == 0 {
		return 0
	}
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.pid), []byte("5"), 0)
	m, _ := procMemory(p.pid)
	return m.rss
}

// peak is the apiserver's VmHWM: its peak resident memory since the last
// resetPeak.
func (p apiserverProc) peak() float64 {
	if p.pid == 0 {
		return 0
	}
	m, _ := procMemory(p.pid)
	return m.hwm
}

// runEnginesChild runs -child-engines engines of the rollout, each with
// its snapshot folder; prints "synced" once every one has caught up, then
// stops them (each writes its snapshot) at SIGTERM.
func runEnginesChild() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", *childConfig)
	if err != nil {
		return err
	}
	r := mschema.Resource{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Namespace: *childNS, LabelSelector: "iidp=iidp",
		Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}
	if *childWhole {
		r.Namespace, r.LabelSelector = "", ""
	}
	p, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{r}})
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var running gosync.WaitGroup
	var engines []*msync.Engine
	for i := range *childEngines {
		dir := filepath.Join(*childSnapshots, fmt.Sprintf("engine-%03d", *childFirst+i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		e, err := msync.New(p, cfg, msync.Options{Logger: quiet, SnapshotDir: dir, SnapshotInterval: time.Hour, StreamingList: *childStreaming, StreamingListAuto: *childAuto})
		if err != nil {
			return err
		}
		engines = append(engines, e)
		running.Go(func() { _ = e.Start(ctx) })
	}
	for _, e := range engines {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
		err := e.WaitForSync(wctx)
		wcancel()
		if err != nil {
			fmt.Println("failed:", err)
			return err
		}
	}
	fmt.Println("synced")
	<-sigs
	cancel()
	running.Wait()
	return nil
}
