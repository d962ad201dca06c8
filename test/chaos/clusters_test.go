package chaos_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// TestTwoClustersUnderFaults runs the faults against one cluster (east,
// the restartable control plane) of an engine that reads two, while the
// other (west, a control plane of its own) keeps changing: west's writes
// must keep arriving during each of east's faults, east's part must be
// stale while it is cut off and west's never, and after each fault the
// union must equal what both apiservers hold (0 ghosts, 0 missing).
//
// It also measures how long a write in west takes to be visible in the
// engine, with east healthy and during east's faults: the log's table,
// kept in BENCHMARKS.md ("Several clusters"). With
// METASYNC_CHAOS_CONTROL=1 the engine reads west alone while east's
// faults run the same: the table then shows what the load of east's
// faults on the same processors costs west's writes by itself.
func TestTwoClustersUnderFaults(t *testing.T) {
	testenv.Need(t, env)
	ctx := context.Background()
	crd := filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")
	env.InstallCRDFile(t, crd)
	env.InstallCRD(t, gadgetCRD)
	env.Namespace(t, ns)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	west.InstallCRDFile(t, crd)
	west.InstallCRD(t, gadgetCRD)
	west.Namespace(t, ns)

	eastProxy, err := testenv.NewProxy("127.0.0.1:0", env.APIServerAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer eastProxy.Close()
	westProxy, err := testenv.NewProxy("127.0.0.1:0", west.APIServerAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer westProxy.Close()
	eastCfg := *env.Config
	eastCfg.Host = "https://" + eastProxy.Addr()
	config := chaosConfig()
	config.Clusters = []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: west.WriteKubeconfig(t, westProxy.Addr())}}
	// The control (METASYNC_CHAOS_CONTROL=1): the same faults of east on
	// the same processors, the engine reading west only: what the
	// machine's load alone does to west's write → visible.
	control := os.Getenv("METASYNC_CHAOS_CONTROL") == "1"
	if control {
		config.Clusters = []mschema.Cluster{{Name: "west", Kubeconfig: west.WriteKubeconfig(t, westProxy.Addr()), Home: true}}
	}
	plan, err := mschema.Compile(config)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() && os.Getenv("METASYNC_CHAOS_DEBUG") == "1" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	e, err := msync.New(plan, &eastCfg, msync.Options{Logger: logger, StaleAfter: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ectx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = e.Start(ectx); close(done) }()
	defer func() { stop(); <-done }()

	seed := uint64(envInt("METASYNC_CHAOS_SEED", 1))
	eastW := &world{t: t, dyn: env.Dynamic, rng: rand.New(rand.NewPCG(seed, 7))}
	westW := &world{t: t, dyn: west.Dynamic, rng: rand.New(rand.NewPCG(seed, 8))}
	eastW.churn(ctx, 20)
	westW.churn(ctx, 20)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	cancel()

	exists := func(index, value string) bool {
		name := value[strings.LastIndex(value, "/")+1:]
		gvr := map[string]schema.GroupVersionResource{"model-to-app": appGVR, "cm-app": cmGVR, "gadget-color": gadgetGVR}[index]
		for _, dyn := range []*testenv.Env{env, west} {
			if _, err := dyn.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
				return true
			}
		}
		return false
	}
	converge := func(what string) diff {
		deadline := time.Now().Add(60 * time.Second)
		for {
			a, errA := truthOf(ctx, env.Dynamic)
			b, errB := truthOf(ctx, west.Dynamic)
			if errA == nil && errB == nil {
				truth := union(a, b)
				if control {
					truth = b
				}
				d, sample := compare(e, truth, exists)
				if d == (diff{}) {
					return d
				}
				if time.Now().After(deadline) {
					t.Errorf("%s: not converged after 60s: %+v (%s)", what, d, sample)
					return d
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	converge("start")

	// probe writes one ConfigMap in west and waits until the engine
	// answers it; it returns how long that took, and checks that west's
	// part is not stale meanwhile.
	probes := 0
	probe := func() time.Duration {
		probes++
		app := fmt.Sprintf("probe-%d", probes)
		start := time.Now()
		if err := westW.apply(ctx, cmGVR, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "probe", "labels": map[string]any{"chaos": "yes"}},
			"data":     map[string]any{"app": app},
		}}); err != nil {
			t.Fatal(err)
		}
		for !slices.Contains(e.Lookup("cm-app", app), ns+"/probe") {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("west's write %s not visible after 30 s while east is faulted", app)
			}
			time.Sleep(time.Millisecond)
		}
		if a := e.Inspect().Answer(msync.KeyOf("cm-app", app)); a.Clusters["west"].Stale {
			t.Errorf("west's part stale while only east is faulted: %+v", a)
		}
		return time.Since(start)
	}
	var healthy []time.Duration
	faulted := map[string][]time.Duration{}
	for range 40 {
		healthy = append(healthy, probe())
	}

	schedule := []string{"apiserver-down", "etcd-restart", "compaction", "black-hole"}
	for _, fault := range schedule {
		eastW.churn(ctx, 10)
		switch fault {
		case "apiserver-down":
			if err := env.StopAPIServer(); err != nil {
				t.Fatal(err)
			}
			for range 20 {
				faulted[fault] = append(faulted[fault], probe())
				westW.churn(ctx, 1)
			}
			if !control {
				eastStale(t, e, true)
			} else {
				// As long as east takes to turn stale: the first write
				// after a pause is the slowest, in either run.
				time.Sleep(3 * time.Second)
			}
			for range 10 {
				faulted[fault] = append(faulted[fault], probe())
			}
			if err := env.StartAPIServer(); err != nil {
				t.Fatal(err)
			}
		case "etcd-restart":
			restarted := make(chan error, 1)
			go func() { restarted <- env.RestartEtcd() }()
			for range 20 {
				faulted[fault] = append(faulted[fault], probe())
			}
			if err := <-restarted; err != nil {
				t.Fatal(err)
			}
		case "compaction":
			for i := range 5 {
				_ = eastW.apply(ctx, cmGVR, &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "v1", "kind": "ConfigMap",
					"metadata": map[string]any{"name": fmt.Sprintf("unwatched-%d", i)},
					"data":     map[string]any{"n": fmt.Sprint(eastW.rng.IntN(1000))},
				}})
			}
			if _, err := env.Compact(ctx); err != nil {
				t.Fatal(err)
			}
			eastProxy.Reset()
			for range 10 {
				faulted[fault] = append(faulted[fault], probe())
			}
		case "black-hole":
			eastProxy.BlackHole(true)
			eastW.churn(ctx, 5) // written, not seen until east is back
			for range 20 {
				faulted[fault] = append(faulted[fault], probe())
				westW.churn(ctx, 1)
			}
			if !control {
				eastStale(t, e, true)
			} else {
				// As long as east takes to turn stale: the first write
				// after a pause is the slowest, in either run.
				time.Sleep(3 * time.Second)
			}
			for range 10 {
				faulted[fault] = append(faulted[fault], probe())
			}
			eastProxy.BlackHole(false)
		}
		if d := converge(fault); d != (diff{}) {
			t.Errorf("after %s: %+v", fault, d)
		}
		if !control {
			eastStale(t, e, false)
		}
		westW.churn(ctx, 10)
	}
	if d := converge("final"); d != (diff{}) {
		t.Fatalf("final: %+v", d)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nwrite in west → visible in the engine, by east's state\n\n| %-16s | %6s | %8s | %8s | %8s |\n|%s|%s|%s|%s|%s|\n",
		"east", "probes", "p50", "p99", "max", strings.Repeat("-", 18), strings.Repeat("-", 8), strings.Repeat("-", 10), strings.Repeat("-", 10), strings.Repeat("-", 10))
	row := func(name string, ds []time.Duration) {
		fmt.Fprintf(&b, "| %-16s | %6d | %8s | %8s | %8s |\n", name, len(ds), pct(ds, 50), pct(ds, 99), pct(ds, 100))
	}
	row("healthy", healthy)
	var all []time.Duration
	for _, fault := range schedule {
		row(fault, faulted[fault])
		all = append(all, faulted[fault]...)
	}
	row("any fault", all)
	t.Log(b.String())
}

// eastStale waits until east's part of an answer is stale (or fresh
// again), with west's fresh all along.
func eastStale(t *testing.T, e *msync.Engine, stale bool) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("east's part stale=%v, west's fresh", stale), func() string {
		cs := e.Inspect().ClusterStates(msync.IndexOf("cm-app"))
		if cs["east"].Stale != stale || cs["west"].Stale {
			return fmt.Sprintf("%+v", cs)
		}
		return ""
	})
}

// union merges two truths: each value once per key, sorted.
func union(a, b map[string]map[string][]string) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for _, m := range []map[string]map[string][]string{a, b} {
		for index, keys := range m {
			if out[index] == nil {
				out[index] = map[string][]string{}
			}
			for k, vs := range keys {
				for _, v := range vs {
					if !slices.Contains(out[index][k], v) {
						out[index][k] = append(out[index][k], v)
					}
				}
				sort.Strings(out[index][k])
			}
		}
	}
	return out
}

// pct is the p-th percentile of ds (100: the largest), to the 0.1 ms.
func pct(ds []time.Duration, p int) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Sorted(slices.Values(ds))
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)].Round(100 * time.Microsecond).String()
}
