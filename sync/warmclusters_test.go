package sync

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/iidp/metasync/internal/warmfile"
	"github.com/iidp/metasync/schema"
)

// clustersConfig is snapshotConfig read from the named clusters (the
// first the engine's own).
func clustersConfig(clusters ...string) *schema.Config {
	cfg := snapshotConfig()
	for i, c := range clusters {
		cl := schema.Cluster{Name: c}
		if i > 0 {
			cl.Kubeconfig = "/unused"
		}
		cfg.Clusters = append(cfg.Clusters, cl)
	}
	return cfg
}

// partOf returns the watcher of the cluster.
func partOf(t testing.TB, e *Engine, cluster string) *follow.Watcher {
	t.Helper()
	for _, w := range watchersOf(e) {
		if w.ClusterName == cluster {
			return w
		}
	}
	t.Fatalf("no part of cluster %q", cluster)
	return nil
}

// listIn lists the AppModels of one cluster: the apps named, each with
// the model "m-shared" and one of its own.
func listIn(t *testing.T, w *follow.Watcher, rv string, apps ...string) {
	t.Helper()
	var list []any
	for i, a := range apps {
		list = append(list, w.Project(fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"ns","resourceVersion":"%d"},"spec":{"type":"model","models":["m-shared","m-%s"]}}`, a, i+1, a)))
	}
	if err := w.Replace(list, rv); err != nil {
		t.Fatal(err)
	}
}

func TestSnapshotOfClusters(t *testing.T) {
	e := testEngine(t, clustersConfig("east", "west"))
	listIn(t, partOf(t, e, "east"), "100", "e1", "e2")
	listIn(t, partOf(t, e, "west"), "7", "w1")
	var buf bytes.Buffer
	if n, err := e.Inspect().WriteSnapshot(&buf); err != nil || n != 3 {
		t.Fatalf("WriteSnapshot = %d, %v", n, err)
	}
	f, err := warmfile.Decode(buf.Bytes())
	if err != nil || f.Version != warmfile.VersionClusters || len(f.Clusters) != 2 || f.Resources[0].TablesLeftOut {
		t.Fatalf("file: %+v, %v", f, err)
	}

	// The same clusters: each part restored with its resourceVersion.
	r := testEngine(t, clustersConfig("east", "west"))
	if _, err := r.Inspect().RestoreSnapshot(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	if got := r.Lookup("model-to-app", "m-shared"); !slices.Equal(got, []string{"e1", "e2", "w1"}) {
		t.Errorf("restored: %q", got)
	}
	// Each cluster's part as soon as RestoreSnapshot returns: a source of
	// several clusters is built from its objects at once (each part is
	// read from the objects behind a key).
	for cluster, want := range map[string][]string{"east": {"e1", "e2"}, "west": {"w1"}} {
		if got := r.Inspect().Answer(Target{Index: "model-to-app", Key: "m-shared", Cluster: cluster}).Values; !slices.Equal(got, want) {
			t.Errorf("restored %s's part: %q, want %q", cluster, got, want)
		}
	}
	for cluster, want := range map[string]struct {
		rv      string
		objects int
	}{"east": {"100", 2}, "west": {"7", 1}} {
		w := partOf(t, r, cluster)
		<-w.Loaded
		if !w.Restored || w.ResumeRV != want.rv || int(w.Count.Load()) != want.objects || !w.Stale() {
			t.Errorf("%s: restored %v from %q, %d objects, stale %v", cluster, w.Restored, w.ResumeRV, w.Count.Load(), w.Stale())
		}
	}
	cs := r.Inspect().ClusterStates(KeyOf("model-to-app", "m-shared"))
	if !cs["east"].Stale || !cs["west"].Stale || !cs["east"].Synced || !cs["west"].Synced {
		t.Errorf("cluster states: %+v", cs)
	}

	// West no longer read, north new: west's part is not restored (nor
	// its values), north's watcher starts as without a snapshot.
	r = testEngine(t, clustersConfig("east", "north"))
	if _, err := r.Inspect().RestoreSnapshot(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	if got := r.Lookup("model-to-app", "m-shared"); !slices.Equal(got, []string{"e1", "e2"}) {
		t.Errorf("without west: %q", got)
	}
	if got := r.Lookup("model-to-app", "m-w1"); len(got) != 0 {
		t.Errorf("west's part restored: %q", got)
	}
	if n := partOf(t, r, "north"); n.Restored || n.IsSynced() {
		t.Errorf("north restored %v, synced %v", n.Restored, n.IsSynced())
	}

	// A snapshot of one cluster for a config of several, and the other
	// way round: refused, nothing restored.
	one := filledEngine(t, 3)
	var single bytes.Buffer
	if _, err := one.Inspect().WriteSnapshot(&single); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		cfg  *schema.Config
		data []byte
	}{
		"one cluster's snapshot, several clusters": {clustersConfig("east", "west"), single.Bytes()},
		"several clusters' snapshot, one cluster":  {snapshotConfig(), buf.Bytes()},
	} {
		r := testEngine(t, c.cfg)
		_, err := r.Inspect().RestoreSnapshot(c.data)
		var se *SnapshotError
		if !errors.As(err, &se) || se.Reason != "config" {
			t.Errorf("%s: %v, want a config error", name, err)
		}
		if r.Stale() || len(r.Lookup("model-to-app", "m-shared")) != 0 {
			t.Errorf("%s: something restored", name)
		}
	}
}

// A cluster without data to write (dropped, say) while the source holds
// some of its objects: its objects are left out, and so are the tables,
// which hold them; the rest restores from its objects.
func TestSnapshotOfClustersLeavesOutAPartWithoutData(t *testing.T) {
	e := testEngine(t, clustersConfig("east", "west"))
	listIn(t, partOf(t, e, "east"), "100", "e1")
	west := partOf(t, e, "west")
	listIn(t, west, "7", "w1")
	west.RV.Store(nil) // as checkGone leaves it: no resourceVersion to resume from
	var buf bytes.Buffer
	if n, err := e.Inspect().WriteSnapshot(&buf); err != nil || n != 1 {
		t.Fatalf("WriteSnapshot = %d, %v", n, err)
	}
	f, err := warmfile.Decode(buf.Bytes())
	if err != nil || !f.Resources[0].TablesLeftOut || len(f.Resources[0].Parts) != 1 || len(f.Clusters) != 1 {
		t.Fatalf("file: %+v, %v", f, err)
	}
	r := testEngine(t, clustersConfig("east", "west"))
	if _, err := r.Inspect().RestoreSnapshot(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	if got := r.Lookup("model-to-app", "m-shared"); !slices.Equal(got, []string{"e1"}) {
		t.Errorf("restored: %q", got)
	}
	if w := partOf(t, r, "west"); w.Restored {
		t.Errorf("west restored")
	}
}

// TestSnapshotStatusColdOnceNoClusterIsWarm: a warm start of several
// clusters whose every part is dropped (each cluster's identity changed)
// is a cold start, as one cluster's is; while one part stays, it is warm.
func TestSnapshotStatusColdOnceNoClusterIsWarm(t *testing.T) {
	st := SnapshotStatus{Load: "warm", WrittenAt: time.Now(),
		Clusters: []ClusterLoad{{Name: "east", Load: "warm"}, {Name: "west", Load: "warm"}}}
	st.setCluster("west", "cold", "cluster")
	if st.Load != "warm" || st.WrittenAt.IsZero() {
		t.Fatalf("one part dropped: %+v", st)
	}
	st.setCluster("east", "cold", "cluster")
	if st.Load != "cold" || st.LoadReason != "cluster" || !st.WrittenAt.IsZero() {
		t.Fatalf("every part dropped: %+v", st)
	}
}

// BenchmarkRestoreSnapshotClusters is BenchmarkRestoreSnapshot of two
// clusters, METASYNC_BENCH_OBJECTS/2 objects each (default 5,000): a
// source of several clusters is built from its objects before
// RestoreSnapshot returns.
func BenchmarkRestoreSnapshotClusters(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("METASYNC_BENCH_OBJECTS")); err == nil && v > 0 {
		n = v
	}
	e := testEngine(b, clustersConfig("east", "west"))
	for _, cluster := range []string{"east", "west"} {
		w := partOf(b, e, cluster)
		list := make([]any, n/2)
		for i := range list {
			list[i] = w.Project(fmt.Sprintf(`{"metadata":{"name":"app-%06d","namespace":"ns","resourceVersion":"%d"},"spec":{"type":"model","models":["m-%06d-0","m-%06d-1","m-%06d-2"]}}`, i, i+1, i, i, i))
		}
		if err := w.Replace(list, "4711"); err != nil {
			b.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := e.Inspect().WriteSnapshot(&buf); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(buf.Len()))
	for b.Loop() {
		r := testEngine(b, clustersConfig("east", "west"))
		if _, err := r.Inspect().RestoreSnapshot(buf.Bytes()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestClusterPartEdges: AnswerIn tells an unknown chain or index as an
// error, and Answer of one narrowed to a cluster has no values; an
// explanation narrowed to a cluster whose objects do not give the key
// says so.
func TestClusterPartEdges(t *testing.T) {
	e := testEngine(t, clustersConfig("east", "west"))
	listIn(t, partOf(t, e, "east"), "100", "e1")
	listIn(t, partOf(t, e, "west"), "7", "w1")
	for _, tg := range []Target{{Chain: "nope", Key: "m-e1"}, {Index: "nope", Key: "m-e1"}} {
		if _, err := e.Inspect().AnswerIn(tg, "east"); err == nil || !strings.Contains(err.Error(), `unknown`) {
			t.Errorf("AnswerIn(%+v) = %v, want an unknown index or chain", tg, err)
		}
		tg.Cluster = "east"
		if a := e.Inspect().Answer(tg); len(a.Values) != 0 {
			t.Errorf("Answer(%+v) = %q", tg, a.Values)
		}
	}
	if a, err := e.Inspect().AnswerIn(KeyOf("model-to-app", "m-e1"), "east"); err != nil || !slices.Equal(a.Values, []string{"e1"}) {
		t.Errorf("AnswerIn of east's key: %+v, %v", a, err)
	}
	x := e.Explain(Target{Index: "model-to-app", Key: "m-e1", Cluster: "west"})
	if len(x.Steps) != 1 || x.Steps[0].Empty != ExplainNotInCluster || len(x.Steps[0].Objects) != 0 {
		t.Errorf("explained in west: %+v", x.Steps)
	}
}
