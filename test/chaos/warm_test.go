package chaos_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/warmfile"
	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// listCounter counts the LIST requests of the watched resources.
type listCounter struct {
	next  http.RoundTripper
	lists atomic.Int64
}

func (c *listCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && r.URL.Query().Get("watch") != "true" {
		for _, plural := range []string{"/appmodels", "/configmaps", "/gadgets"} {
			if strings.HasSuffix(r.URL.Path, plural) {
				c.lists.Add(1)
			}
		}
	}
	return c.next.RoundTrip(r)
}

// warmEngine is one run of an engine with a snapshot folder.
type warmEngine struct {
	*msync.Engine
	lists *listCounter
	log   *testenv.Buffer
	stop  func()
}

func newWarmEngine(t *testing.T, plan *mschema.Plan, dir string) *warmEngine {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	c := &listCounter{}
	cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper {
		c.next = next
		return c
	}
	logs := &testenv.Buffer{}
	e, err := msync.New(plan, cfg, msync.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), StaleAfter: 3 * time.Second,
		SnapshotDir: dir, SnapshotInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return &warmEngine{Engine: e, lists: c, log: logs}
}

func (w *warmEngine) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Start(ctx); close(done) }()
	var once gosync.Once
	w.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(w.stop)
}

// converged waits until e answers as the apiserver does.
func converged(t *testing.T, e *msync.Engine, what string) {
	t.Helper()
	ctx := context.Background()
	testenv.Eventually(t, what, func() string {
		want, err := truth(ctx)
		if err != nil {
			return err.Error()
		}
		if d, sample := compare(e, want, func(string, string) bool { return true }); d != (diff{}) {
			return fmt.Sprintf("%+v (%s)", d, sample)
		}
		return ""
	})
}

// answers returns every answer of the engine's three indexes.
func answers(e *msync.Engine) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for _, index := range []string{"model-to-app", "cm-app", "gadget-color"} {
		out[index] = map[string][]string{}
		for _, k := range e.Keys(index) {
			out[index][k] = e.Lookup(index, k)
		}
	}
	return out
}

// moveRevision writes objects no engine watches, so that etcd's revision
// passes every resource's resourceVersion and a compaction there reaches
// all of them.
func moveRevision(t *testing.T, w *world) {
	for i := range 3 {
		if err := w.apply(context.Background(), cmGVR, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": fmt.Sprintf("unwatched-%d", i)},
			"data":     map[string]any{"n": strconv.Itoa(w.rng.IntN(1000))},
		}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWarmStart stops and starts an engine with a snapshot folder while the
// cluster changes: the restarted engine answers from the snapshot before
// it asks the apiserver anything, marked stale; it resumes its watches
// without a list when etcd still has the history, and lists (applying only
// the differences) when a compaction took it; with the apiserver down, it
// answers from the snapshot, not ready, until the apiserver is back.
func TestWarmStart(t *testing.T) {
	testenv.Need(t, env)
	ctx := context.Background()
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.InstallCRD(t, gadgetCRD)
	env.Namespace(t, ns)
	w := &world{t: t, dyn: env.Dynamic, rng: rand.New(rand.NewPCG(7, 7))}
	w.churn(ctx, 40)
	plan, err := mschema.Compile(chaosConfig())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()

	first := newWarmEngine(t, plan, dir)
	if st := first.Inspect().SnapshotStatus(); st.Load != "cold" || st.LoadReason != "missing" {
		t.Errorf("first start: %+v, want a cold start for a missing snapshot", st)
	}
	first.start(t)
	converged(t, first.Engine, "first engine")
	first.stop()
	fi, err := os.Stat(filepath.Join(dir, msync.SnapshotFile))
	if err != nil {
		t.Fatalf("no snapshot after the stop: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("snapshot mode %v, want 0600", fi.Mode().Perm())
	}
	held := answers(first.Engine)

	// restart checks that a new engine answers what the last one held,
	// stale, before it starts; then starts it.
	restart := func(t *testing.T, before ...func(*warmEngine)) *warmEngine {
		t.Helper()
		e := newWarmEngine(t, plan, dir)
		if st := e.Inspect().SnapshotStatus(); st.Load != "warm" {
			t.Fatalf("not a warm start: %+v\n%s", st, e.log)
		}
		if got := answers(e.Engine); !equalAnswers(got, held) {
			t.Errorf("answers from the snapshot differ from the last engine's:\n got %v\nwant %v", got, held)
		}
		if !e.Stale() || e.Ready() {
			t.Errorf("before its watches caught up: stale %v, ready %v; want stale and not ready", e.Stale(), e.Ready())
		}
		for _, st := range e.Status() {
			if !st.Synced || !st.Stale || !strings.Contains(st.Reason, "stale") {
				t.Errorf("restored resource %s: synced %v stale %v reason %q", st.Name, st.Synced, st.Stale, st.Reason)
			}
		}
		if err := e.WaitForData(ctx); err != nil {
			t.Errorf("WaitForData after a warm start: %v", err)
		}
		for _, f := range before {
			f(e)
		}
		e.start(t)
		return e
	}
	waitSynced := func(t *testing.T, e *warmEngine) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := e.WaitForSync(wctx); err != nil {
			t.Fatalf("%v\n%s", err, e.log)
		}
		converged(t, e.Engine, "after the warm start")
		// After an outage longer than StaleAfter a resource is ready
		// again once a watch has stayed open establishedAfter (1 s): the
		// answers may converge before that.
		testenv.Eventually(t, "caught up: not stale, ready", func() string {
			if e.Stale() || !e.Ready() {
				return fmt.Sprintf("stale %v, ready %v", e.Stale(), e.Ready())
			}
			return ""
		})
	}

	t.Run("resume", func(t *testing.T) {
		w.churn(ctx, 30) // while no engine runs: creates, updates, relabels, deletes
		e := restart(t)
		waitSynced(t, e)
		// This apiserver runs without its watch cache, which is what sends
		// bookmarks: a resumed watch whose last event is older than etcd's
		// revision cannot show that it caught up, and lists (once). With
		// the watch cache, a resume needs no list (test/integration's
		// TestWarmStartIsStaleUntilCaughtUp).
		if n := e.lists.lists.Load(); n > 3 {
			t.Errorf("%d LIST requests; at most one per resource\n%s", n, e.log)
		}
		w.churn(ctx, 10)
		converged(t, e.Engine, "events after the resume")
		e.stop()
		held = answers(e.Engine)
	})

	t.Run("relist after a compaction", func(t *testing.T) {
		w.churn(ctx, 30)
		moveRevision(t, w)
		if _, err := env.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		want, err := truth(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// An index subscriber from before the start gets the snapshot's
		// answers, then hears only of the keys that the relist changed.
		var sub *msync.Subscription
		e := restart(t, func(e *warmEngine) {
			if sub, err = e.Subscribe(ctx, msync.IndexOf("cm-app")); err != nil {
				t.Fatal(err)
			}
			for {
				nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				ev, err := sub.Next(nctx)
				cancel()
				if err != nil {
					t.Fatalf("the snapshot's answers: %v", err)
				}
				if ev.Type == msync.EventSynced {
					break
				}
				if ev.Type != msync.EventSnapshot || !slices.Equal(ev.Values, held["cm-app"][ev.Key]) {
					t.Errorf("before the start: %v %q %q, want the snapshot's %q", ev.Type, ev.Key, ev.Values, held["cm-app"][ev.Key])
				}
			}
		})
		defer sub.Close()
		waitSynced(t, e)
		if n := e.lists.lists.Load(); n < 3 {
			t.Errorf("%d LIST requests after a compaction of every resource's history; want a list of each", n)
		}
		changed := map[string]bool{}
		for k, vs := range want["cm-app"] {
			if !slices.Equal(vs, held["cm-app"][k]) {
				changed[k] = true
			}
		}
		for k := range held["cm-app"] {
			if _, ok := want["cm-app"][k]; !ok {
				changed[k] = true
			}
		}
		heard := map[string]bool{}
		for {
			nctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			ev, err := sub.Next(nctx)
			cancel()
			if err != nil {
				break
			}
			if ev.Type == msync.EventUpdate {
				heard[ev.Key] = true
				if !changed[ev.Key] {
					t.Errorf("update of %q, which the relist did not change", ev.Key)
				}
			}
		}
		for k := range changed {
			if !heard[k] {
				t.Errorf("no update of %q, which the relist changed", k)
			}
		}
		t.Logf("relist: %d LISTs, %d keys of cm-app changed, %d heard", e.lists.lists.Load(), len(changed), len(heard))
		e.stop()
		held = answers(e.Engine)
	})

	t.Run("apiserver down at start", func(t *testing.T) {
		if err := env.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		up := false
		defer func() {
			if !up {
				_ = env.StartAPIServer()
			}
		}()
		e := restart(t)
		time.Sleep(3 * time.Second)
		if !e.Stale() || e.Ready() {
			t.Errorf("apiserver down: stale %v, ready %v; want stale, not ready", e.Stale(), e.Ready())
		}
		if got := answers(e.Engine); !equalAnswers(got, held) {
			t.Errorf("answers with the apiserver down differ from the snapshot's")
		}
		for _, st := range e.Status() {
			if !strings.Contains(st.Reason, "stale") {
				t.Errorf("%s: reason %q", st.Name, st.Reason)
			}
		}
		if err := env.StartAPIServer(); err != nil {
			t.Fatal(err)
		}
		up = true
		w.churn(ctx, 20)
		waitSynced(t, e)
		e.stop()
		held = answers(e.Engine)
	})

	// A snapshot whose resourceVersions the apiserver cannot resume from:
	// newer than its own (another cluster, or etcd restored from a backup),
	// or not its own at all. Each lists and converges; none stays stale or,
	// worse, ready with the snapshot's answers.
	for _, rv := range []string{"999999999", "not-a-version"} {
		t.Run("resourceVersion "+rv, func(t *testing.T) {
			rewriteVersions(t, dir, rv)
			w.churn(ctx, 20)
			e := restart(t)
			waitSynced(t, e)
			if n := e.lists.lists.Load(); n < 3 {
				t.Errorf("%d LIST requests; each resource must list", n)
			}
			e.stop()
			held = answers(e.Engine)
		})
	}

	t.Run("bad snapshots start cold", func(t *testing.T) {
		good, err := os.ReadFile(filepath.Join(dir, msync.SnapshotFile))
		if err != nil {
			t.Fatal(err)
		}
		other := chaosConfig()
		other.Resources[1].LabelSelector = "chaos=other"
		otherPlan, err := mschema.Compile(other)
		if err != nil {
			t.Fatal(err)
		}
		flipped := bytes.Clone(good)
		flipped[len(flipped)/3] ^= 4
		for _, c := range []struct {
			name, reason string
			data         []byte
			plan         *mschema.Plan
		}{
			{"another config", "config", good, otherPlan},
			{"truncated", "checksum", good[:len(good)*2/3], plan},
			{"bit flipped", "checksum", flipped, plan},
			{"empty", "truncated", nil, plan},
		} {
			bad := t.TempDir()
			if err := os.WriteFile(filepath.Join(bad, msync.SnapshotFile), c.data, 0o600); err != nil {
				t.Fatal(err)
			}
			e := newWarmEngine(t, c.plan, bad)
			st := e.Inspect().SnapshotStatus()
			if st.Load != "cold" || st.LoadReason != c.reason {
				t.Errorf("%s: %+v, want a cold start for %q", c.name, st, c.reason)
			}
			if !strings.Contains(e.log.String(), "snapshot ignored: cold start") || !strings.Contains(e.log.String(), "reason="+c.reason) {
				t.Errorf("%s: the reason is not logged:\n%s", c.name, e.log)
			}
			if e.Stale() || len(e.Keys("cm-app")) != 0 {
				t.Errorf("%s: a cold start answers from the snapshot", c.name)
			}
		}
	})
}

// rewriteVersions rewrites the snapshot in dir with every resource's
// resourceVersion set to rv.
func rewriteVersions(t *testing.T, dir, rv string) {
	t.Helper()
	path := filepath.Join(dir, msync.SnapshotFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := warmfile.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := warmfile.NewEncoder(&buf, f.Config, f.Cluster, f.WrittenAt, len(f.Resources))
	for _, r := range f.Resources {
		enc.Resource(r.Name, rv, r.Relist, r.Indexes, r.Strings)
		for _, tb := range r.Tables {
			enc.Table(tb.WithObjects)
			tb.Each(enc.Key)
		}
		r.EachObject(func(o warmfile.Object) { enc.Object(o.Key, o.Payload, o.HasPayload, o.Meta, o.Entries) })
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

func equalAnswers(a, b map[string]map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for index, keys := range a {
		if len(keys) != len(b[index]) {
			return false
		}
		for k, vs := range keys {
			if !slices.Equal(vs, b[index][k]) {
				return false
			}
		}
	}
	return true
}
