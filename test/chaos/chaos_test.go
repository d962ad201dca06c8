// Package chaos_test checks that metasync's indexes converge to the truth
// while a real control plane suffers faults: kube-apiserver and etcd
// restarts, etcd compactions (410 Gone), connection resets and black holes,
// and a CRD deleted and recreated; and (TestTwoClustersUnderFaults) the
// same faults against one of two clusters that an engine reads, while the
// other keeps changing.
//
// `make test` runs a short version; `make chaos` the full one (2,000
// operations), whose report RELIABILITY.md keeps. Knobs:
// METASYNC_CHAOS_OPS (operations), METASYNC_CHAOS_FULL=1 (the full fault
// schedule), METASYNC_CHAOS_SEED.
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
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	// Detect a black-holed connection in seconds, not client-go's default
	// 30 s + 15 s: HTTP/2 pings after 2 s of silence, dead after 2 s more.
	os.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "2")
	os.Setenv("HTTP2_PING_TIMEOUT_SECONDS", "2")
	if !testenv.Available() {
		fmt.Fprintln(os.Stderr, "chaos: KUBEBUILDER_ASSETS is not set; skipping (run `make test`)")
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "metasync-chaos-")
	if err != nil {
		panic(err)
	}
	// Without the watch cache, watches read etcd directly, so that a
	// compaction turns a resumed watch into 410 Gone.
	before := goleak.IgnoreCurrent()
	env, err = testenv.StartRestartable(dir, "--watch-cache=false")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.RemoveAll(dir)
	os.Exit(testenv.LeakCheck(code, before))
}

const ns = "chaos"

var (
	appGVR    = schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}
	cmGVR     = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	gadgetGVR = schema.GroupVersionResource{Group: "chaos.iidp.com", Version: "v1", Resource: "gadgets"}
	crdGVR    = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

var gadgetCRD = testenv.LooseCRD("chaos.iidp.com", "Gadget", "gadgets")

func chaosConfig() *mschema.Config {
	return &mschema.Config{Resources: []mschema.Resource{
		{Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels", Namespace: ns, LabelSelector: "iidp=iidp",
			Fields:  map[string]string{"type": "spec.type"},
			Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}}},
		{Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns, LabelSelector: "chaos=yes",
			Indexes: []mschema.Index{{Name: "cm-app", Key: "data.app"}}},
		{Name: "gadgets", Group: "chaos.iidp.com", Version: "v1", Resource: "gadgets", Namespace: ns,
			Indexes: []mschema.Index{{Name: "gadget-color", Key: "spec.color"}}},
	}}
}

// truth lists every resource straight from the apiserver and evaluates the
// indexes the obvious way: index -> key -> sorted values.
func truth(ctx context.Context) (map[string]map[string][]string, error) {
	return truthOf(ctx, env.Dynamic)
}

// truthOf is truth of the apiserver that dyn talks to.
func truthOf(ctx context.Context, dyn dynamic.Interface) (map[string]map[string][]string, error) {
	out := map[string]map[string][]string{"model-to-app": {}, "cm-app": {}, "gadget-color": {}}
	add := func(index, key, value string) {
		if !slices.Contains(out[index][key], value) {
			out[index][key] = append(out[index][key], value)
		}
	}
	apps, err := dyn.Resource(appGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: "iidp=iidp"})
	if err != nil {
		return nil, err
	}
	for _, a := range apps.Items {
		models, _, _ := unstructured.NestedStringSlice(a.Object, "spec", "models")
		for _, m := range models {
			add("model-to-app", m, a.GetName())
		}
	}
	cms, err := dyn.Resource(cmGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: "chaos=yes"})
	if err != nil {
		return nil, err
	}
	for _, c := range cms.Items {
		if app, ok, _ := unstructured.NestedString(c.Object, "data", "app"); ok {
			add("cm-app", app, ns+"/"+c.GetName())
		}
	}
	gs, err := dyn.Resource(gadgetGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	if gs != nil {
		for _, g := range gs.Items {
			if c, ok, _ := unstructured.NestedString(g.Object, "spec", "color"); ok {
				add("gadget-color", c, ns+"/"+g.GetName())
			}
		}
	}
	for _, m := range out {
		for k := range m {
			sort.Strings(m[k])
		}
	}
	return out, nil
}

// diff compares the engine with the truth: ghost pairs (in the engine, not
// in the truth), missing pairs, and the ghosts whose object is gone (lost
// deletes).
type diff struct{ ghosts, missing, lostDeletes int }

func compare(e *msync.Engine, want map[string]map[string][]string, exists func(index, value string) bool) (d diff, sample string) {
	for index, keys := range want {
		for _, k := range e.Keys(index) {
			for _, v := range e.Lookup(index, k) {
				if !slices.Contains(keys[k], v) {
					d.ghosts++
					if !exists(index, v) {
						d.lostDeletes++
					}
					sample = fmt.Sprintf("ghost %s[%s]=%s", index, k, v)
				}
			}
		}
		for k, vs := range keys {
			got := e.Lookup(index, k)
			for _, v := range vs {
				if !slices.Contains(got, v) {
					d.missing++
					sample = fmt.Sprintf("missing %s[%s]=%s", index, k, v)
				}
			}
		}
	}
	return d, sample
}

type world struct {
	t   *testing.T
	dyn dynamic.Interface // the cluster written to
	rng *rand.Rand
	ops int
	// errors while the apiserver was away, retried
	retries, skipped int
}

func (w *world) apply(ctx context.Context, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) error {
	_, err := w.dyn.Resource(gvr).Namespace(ns).Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "chaos", Force: true})
	return err
}

// op performs one random create, update, relabel or delete.
func (w *world) op(ctx context.Context) {
	w.ops++
	name := fmt.Sprintf("o%02d", w.rng.IntN(40))
	kind := w.rng.IntN(10)
	var gvr schema.GroupVersionResource
	var obj *unstructured.Unstructured
	switch w.rng.IntN(3) {
	case 0:
		gvr = appGVR
		var models []any
		for range 1 + w.rng.IntN(3) {
			models = append(models, fmt.Sprintf("model-%d", w.rng.IntN(30)))
		}
		label := "iidp"
		if kind >= 8 {
			label = "off" // relabel: leaves the selector
		}
		obj = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "iidp.com/v1", "kind": "AppModel",
			"metadata": map[string]any{"name": name, "labels": map[string]any{"iidp": label}},
			"spec":     map[string]any{"models": models, "type": "model"},
		}}
	case 1:
		gvr = cmGVR
		label := "yes"
		if kind >= 8 {
			label = "no"
		}
		obj = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "labels": map[string]any{"chaos": label}},
			"data":     map[string]any{"app": fmt.Sprintf("app-%d", w.rng.IntN(15))},
		}}
	default:
		gvr = gadgetGVR
		obj = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "chaos.iidp.com/v1", "kind": "Gadget",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"color": fmt.Sprintf("color-%d", w.rng.IntN(8))},
		}}
	}
	for attempt := 0; ; attempt++ {
		var err error
		if kind == 6 || kind == 7 {
			err = w.dyn.Resource(gvr).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				err = nil
			}
		} else {
			err = w.apply(ctx, gvr, obj)
		}
		switch {
		case err == nil:
			return
		case apierrors.IsNotFound(err) || strings.Contains(err.Error(), "the server could not find the requested resource"):
			w.skipped++ // the gadget CRD is away
			return
		case attempt > 300:
			w.t.Fatalf("operation failed for a minute: %v", err)
		}
		w.retries++
		time.Sleep(200 * time.Millisecond)
	}
}

func (w *world) churn(ctx context.Context, n int) {
	for range n {
		w.op(ctx)
	}
}

type faultResult struct {
	name      string
	converge  time.Duration
	relists   int64
	watchErrs int64
	d         diff
}

func relists(e *msync.Engine) (r, werrs int64) {
	for _, st := range e.Status() {
		r += st.Relists
		werrs += st.WatchErrors + st.ListErrors
	}
	return
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestConvergenceUnderFaults runs the faults against an engine that lists
// with LIST, then against one that lists as the apiserver streams
// (Options.StreamingList).
func TestConvergenceUnderFaults(t *testing.T) {
	testenv.Need(t, env)
	t.Run("LIST", func(t *testing.T) { convergeUnderFaults(t, false) })
	t.Run("streaming lists", func(t *testing.T) { convergeUnderFaults(t, true) })
}

// convergeUnderFaults is TestConvergenceUnderFaults with its engine's
// lists streamed or not.
func convergeUnderFaults(t *testing.T, streaming bool) {
	ctx := context.Background()
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.InstallCRD(t, gadgetCRD)
	env.Namespace(t, ns)

	totalOps := envInt("METASYNC_CHAOS_OPS", 240)
	seed := uint64(envInt("METASYNC_CHAOS_SEED", 1))
	schedule := []string{"apiserver-restart", "etcd-restart", "compaction", "proxy-reset", "black-hole", "crd-delete-recreate"}
	if v := os.Getenv("METASYNC_CHAOS_SCHEDULE"); v != "" {
		schedule = strings.Split(v, ",")
	} else if os.Getenv("METASYNC_CHAOS_FULL") == "1" {
		schedule = []string{"apiserver-restart", "proxy-reset", "compaction", "etcd-restart", "apiserver-restart",
			"black-hole", "compaction", "proxy-reset", "crd-delete-recreate", "apiserver-restart"}
	}
	w := &world{t: t, dyn: env.Dynamic, rng: rand.New(rand.NewPCG(seed, 99))}
	w.churn(ctx, 30)

	proxy, err := testenv.NewProxy("127.0.0.1:0", env.APIServerAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	cfg := rest.CopyConfig(env.Config)
	cfg.Host = "https://" + proxy.Addr()
	plan, err := mschema.Compile(chaosConfig())
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		level := slog.LevelWarn
		if os.Getenv("METASYNC_CHAOS_DEBUG") == "1" {
			level = slog.LevelDebug
		}
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	e, err := msync.New(plan, cfg, msync.Options{Logger: logger, StaleAfter: 3 * time.Second, StreamingList: streaming})
	if err != nil {
		t.Fatal(err)
	}
	ectx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = e.Start(ectx); close(done) }()
	defer func() { stop(); <-done }()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	cancel()

	exists := func(index, value string) bool {
		name := value[strings.LastIndex(value, "/")+1:]
		gvr := map[string]schema.GroupVersionResource{"model-to-app": appGVR, "cm-app": cmGVR, "gadget-color": gadgetGVR}[index]
		_, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil
	}
	converge := func(what string) faultResult {
		start := time.Now()
		r0, _ := relists(e)
		_ = r0
		deadline := start.Add(60 * time.Second)
		for {
			want, err := truth(ctx)
			if err == nil {
				d, sample := compare(e, want, exists)
				if d == (diff{}) {
					return faultResult{name: what, converge: time.Since(start)}
				}
				if time.Now().After(deadline) {
					for _, st := range e.Status() {
						t.Logf("status %s: watches=%d relists=%d listErrors=%d watchErrors=%d error=%q added=%d updated=%d deleted=%d", st.Name, st.Watches, st.Relists, st.ListErrors, st.WatchErrors, st.Error, st.Added, st.Updated, st.Deleted)
					}
					t.Errorf("%s: not converged after 60s: %+v (%s)", what, d, sample)
					return faultResult{name: what, converge: time.Since(start), d: d}
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	perPhase := max(10, (totalOps-30)/(len(schedule)+1))
	var results []faultResult
	for _, fault := range schedule {
		w.churn(ctx, perPhase/2)
		r0, e0 := relists(e)
		switch fault {
		case "apiserver-restart":
			if err := env.StopAPIServer(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			if err := env.StartAPIServer(); err != nil {
				t.Fatal(err)
			}
		case "etcd-restart":
			if err := env.RestartEtcd(); err != nil {
				t.Fatal(err)
			}
		case "compaction":
			// Writes the engine does not watch move etcd's revision past
			// what the watches have seen; compact there, then cut the
			// connections: every watch resumes from a compacted revision.
			for i := range 5 {
				_ = w.apply(ctx, cmGVR, &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "v1", "kind": "ConfigMap",
					"metadata": map[string]any{"name": fmt.Sprintf("unwatched-%d", i)},
					"data":     map[string]any{"n": strconv.Itoa(w.rng.IntN(1000))},
				}})
			}
			if _, err := env.Compact(ctx); err != nil {
				t.Fatal(err)
			}
			proxy.Reset()
		case "proxy-reset":
			w.churn(ctx, 5)
			proxy.Reset()
		case "black-hole":
			proxy.BlackHole(true)
			w.churn(ctx, perPhase/4)
			time.Sleep(6 * time.Second)
			proxy.BlackHole(false)
		case "crd-delete-recreate":
			if err := env.Dynamic.Resource(crdGVR).Delete(ctx, "gadgets.chaos.iidp.com", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, "gadget CRD gone", func() string {
				if _, err := env.Dynamic.Resource(crdGVR).Get(ctx, "gadgets.chaos.iidp.com", metav1.GetOptions{}); err == nil {
					return "still there"
				}
				return ""
			})
			w.churn(ctx, 10)
			env.InstallCRD(t, gadgetCRD)
		}
		res := converge(fault)
		r1, e1 := relists(e)
		res.relists, res.watchErrs = r1-r0, e1-e0
		results = append(results, res)
		w.churn(ctx, perPhase/2)
	}
	w.churn(ctx, totalOps-w.ops)
	final := converge("final")
	results = append(results, final)

	var b strings.Builder
	fmt.Fprintf(&b, "\nconvergence under faults: %d operations (%d retried while the apiserver was away, %d skipped while the gadget CRD was away), seed %d\n\n", w.ops, w.retries, w.skipped, seed)
	fmt.Fprintf(&b, "| %-20s | %12s | %8s | %15s | %6s | %7s | %12s |\n", "fault", "converged in", "relists", "list/watch errs", "ghosts", "missing", "lost deletes")
	fmt.Fprintf(&b, "|%s|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 22), strings.Repeat("-", 14), strings.Repeat("-", 10), strings.Repeat("-", 17), strings.Repeat("-", 8), strings.Repeat("-", 9), strings.Repeat("-", 14))
	var lost, ghosts int
	for _, r := range results {
		fmt.Fprintf(&b, "| %-20s | %12s | %8d | %15d | %6d | %7d | %12d |\n", r.name, r.converge.Round(time.Millisecond), r.relists, r.watchErrs, r.d.ghosts, r.d.missing, r.d.lostDeletes)
		lost += r.d.lostDeletes
		ghosts += r.d.ghosts
	}
	fmt.Fprintf(&b, "\n\"converged in\": from the end of the fault (the apiserver back, the connection open again...) until every index equals one rebuilt from a fresh LIST, with writes before and during the fault.\n")
	fmt.Fprintf(&b, "lost deletes: %d, ghost entries: %d (both must be 0)\n", lost, ghosts)
	t.Log(b.String())
	if path := os.Getenv("METASYNC_CHAOS_REPORT"); path != "" {
		if streaming {
			path += ".streaming" // the LIST run's report stays at path
		}
		_ = os.WriteFile(path, []byte(b.String()), 0o644)
	}
	if lost != 0 || ghosts != 0 {
		t.Fatalf("lost deletes %d, ghosts %d", lost, ghosts)
	}
}
