package sync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	gosync "sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/internal/warmfile"
	"github.com/iidp/metasync/schema"
)

func snapshotConfig() *schema.Config {
	return &schema.Config{Resources: []schema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels", Namespace: "ns",
		Fields:  map[string]string{"type": "spec.type"},
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}}
}

// filledEngine is an engine without a cluster whose AppModels are listed
// once: n objects of three models each.
func filledEngine(tb testing.TB, n int) *Engine {
	e := testEngine(tb, snapshotConfig())
	w := watchersOf(e)[0]
	list := make([]any, n)
	for i := range n {
		list[i] = w.Project(fmt.Sprintf(`{"metadata":{"name":"app-%06d","namespace":"ns","resourceVersion":"%d"},"spec":{"type":"model","models":["m-%06d-0","m-%06d-1","m-%06d-2"]}}`, i, i+1, i, i, i))
	}
	if err := w.Replace(list, "4711"); err != nil {
		tb.Fatal(err)
	}
	return e
}

func TestSnapshotRoundTrip(t *testing.T) {
	e := filledEngine(t, 500)
	var buf bytes.Buffer
	if n, err := e.Inspect().WriteSnapshot(&buf); err != nil || n != 500 {
		t.Fatalf("WriteSnapshot = %d, %v", n, err)
	}
	r := testEngine(t, snapshotConfig())
	if _, err := r.Inspect().RestoreSnapshot(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"m-000000-0", "m-000499-2", "nope"} {
		if a, b := e.Lookup("model-to-app", k), r.Lookup("model-to-app", k); fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("%s: %v, restored %v", k, a, b)
		}
	}
	w := watchersOf(r)[0]
	if !w.Restored || w.ResumeRV != "4711" || !r.Stale() || r.Inspect().Synced() {
		t.Errorf("restored %v from %q, stale %v", w.Restored, w.ResumeRV, r.Stale())
	}
	if p, ok := r.store.Snapshot().Payload(w.Src, "ns/app-000007"); !ok || p != `{"type":"model"}` {
		t.Errorf("payload %v %v", p, ok)
	}
}

// BenchmarkRestoreSnapshot: METASYNC_BENCH_OBJECTS objects (default 10,000).
func BenchmarkRestoreSnapshot(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("METASYNC_BENCH_OBJECTS")); err == nil && v > 0 {
		n = v
	}
	e := filledEngine(b, n)
	var buf bytes.Buffer
	if _, err := e.Inspect().WriteSnapshot(&buf); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(buf.Len()))
	for b.Loop() {
		r := testEngine(b, snapshotConfig())
		if _, err := r.Inspect().RestoreSnapshot(buf.Bytes()); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		<-watchersOf(r)[0].Loaded // the background rebuild, apart
		b.StartTimer()
	}
}

func BenchmarkWriteSnapshot(b *testing.B) {
	e := filledEngine(b, 10000)
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if _, err := e.Inspect().WriteSnapshot(&buf); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(buf.Len()))
}

// restored returns an engine restored from a snapshot of filledEngine(n).
func restored(t *testing.T, n int) (*Engine, []byte) {
	t.Helper()
	var buf bytes.Buffer
	if _, err := filledEngine(t, n).Inspect().WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	r := testEngine(t, snapshotConfig())
	if _, err := r.Inspect().RestoreSnapshot(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	return r, buf.Bytes()
}

func TestSnapshotOfStaleDataKeepsItsAge(t *testing.T) {
	r, data := restored(t, 10)
	f, err := warmfile.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	var again bytes.Buffer
	if _, err := r.Inspect().WriteSnapshot(&again); err != nil {
		t.Fatal(err)
	}
	g, err := warmfile.Decode(again.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !g.WrittenAt.Equal(f.WrittenAt) {
		t.Errorf("a snapshot of data that never caught up says %v, its data is of %v", g.WrittenAt, f.WrittenAt)
	}
}

func TestReloadOfAStaleResourceStaysStale(t *testing.T) {
	r, _ := restored(t, 10)
	cfg := snapshotConfig()
	cfg.Resources[0].Resync = time.Hour // a restart, the same data
	plan, err := schema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := r.Reload(plan); err != nil || len(ch.Restart) != 1 {
		t.Fatalf("Reload = %+v, %v", ch, err)
	}
	if !r.Stale() || r.Ready() {
		t.Errorf("after a restart of a stale resource: stale %v, ready %v", r.Stale(), r.Ready())
	}
	// The next snapshot keeps what the resource answers: a restart in the
	// outage must not start empty.
	var buf bytes.Buffer
	n, err := r.Inspect().WriteSnapshot(&buf)
	if err != nil || n != 10 {
		t.Fatalf("WriteSnapshot of a restarted resource that has not listed: %d objects, %v; want the 10 it answers", n, err)
	}
	f, err := warmfile.Decode(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Resources) != 1 || f.Resources[0].Relist {
		t.Errorf("resources %+v: want the one, resumable (its data is the new definition's)", f.Resources)
	}
	again := testEngine(t, cfg)
	if _, err := again.Inspect().RestoreSnapshot(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	if got := again.Lookup("model-to-app", "m-000003-1"); len(got) == 0 || !again.Stale() {
		t.Errorf("restored from the restarted resource's snapshot: model-3 → %v, stale %v", got, again.Stale())
	}
}

func TestReloadThatChangesDataKeepsItsAnswersForAList(t *testing.T) {
	r, _ := restored(t, 10)
	cfg := snapshotConfig()
	// Another index first, then the old one: the objects' entries are in
	// the old order, the snapshot writes them in the new one.
	cfg.Resources[0].Indexes = append([]schema.Index{{Name: "app-by-name", Key: "metadata.name"}}, cfg.Resources[0].Indexes...)
	plan, err := schema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := r.Reload(plan); err != nil || len(ch.Restart) != 1 {
		t.Fatalf("Reload = %+v, %v", ch, err)
	}
	want := r.Lookup("model-to-app", "m-000003-1")
	if len(want) == 0 {
		t.Fatal("m-000003-1 answers nothing before the restore")
	}
	var buf bytes.Buffer
	if n, err := r.Inspect().WriteSnapshot(&buf); err != nil || n != 10 {
		t.Fatalf("WriteSnapshot: %d objects, %v; want 10", n, err)
	}
	f, err := warmfile.Decode(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Resources) != 1 || !f.Resources[0].Relist {
		t.Fatalf("resources %+v: want the one, to be listed (its data is the old definition's)", f.Resources)
	}
	again := testEngine(t, cfg)
	if _, err := again.Inspect().RestoreSnapshot(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	ws := watchersOf(again)
	<-ws[0].Loaded // the objects written: the indexes are what they say
	if ws[0].ResumeRV != "" || !again.Stale() {
		t.Errorf("resumeRV %q, stale %v: data of another definition must be listed, stale meanwhile", ws[0].ResumeRV, again.Stale())
	}
	if got := again.Lookup("model-to-app", "m-000003-1"); !slices.Equal(got, want) {
		t.Errorf("model-3 → %v after the restore, %v before", got, want)
	}
}

func TestGoneResourceIsNotSnapshotted(t *testing.T) {
	e := filledEngine(t, 10)
	w := watchersOf(e)[0]
	w.CheckGone(apierrors.NewNotFound(k8sschema.GroupResource{Group: "iidp.com", Resource: "appmodels"}, ""))
	var buf bytes.Buffer
	if _, err := e.Inspect().WriteSnapshot(&buf); !errors.Is(err, ErrNothingToSnapshot) {
		t.Errorf("a resource emptied by a 404 was snapshotted (%v): a resume would never bring its objects back", err)
	}
}

func TestRestoreRefusesAnyVersion(t *testing.T) {
	var buf bytes.Buffer
	enc := warmfile.NewEncoder(&buf, compiledPlan(t).DataHash(), "", time.Now(), 1)
	enc.Resource("appmodels", "0", false, []string{"model-to-app"}, nil)
	enc.Table(true)
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := testEngine(t, snapshotConfig()).Inspect().RestoreSnapshot(buf.Bytes())
	var se *SnapshotError
	if !errors.As(err, &se) || se.Reason != "corrupt" {
		t.Errorf("resourceVersion 0: %v", err)
	}
}

func compiledPlan(t *testing.T) *compiled.Plan {
	plan, err := schema.Compile(snapshotConfig())
	if err != nil {
		t.Fatal(err)
	}
	return compiled.Of(plan)
}

// craftedSnapshot writes a snapshot for snapshotConfig whose table claims
// the key "ghost" (no object has it), with fillers objects more, and the
// object "ns/app-1" twice.
func craftedSnapshot(t *testing.T, dir string, fillers int) {
	t.Helper()
	var buf bytes.Buffer
	enc := warmfile.NewEncoder(&buf, compiledPlan(t).DataHash(), "", time.Now(), 1)
	enc.Resource("appmodels", "4711", false, []string{"model-to-app"}, []string{"ghost-app", "ns/ghost"})
	enc.Table(true)
	enc.Key("ghost", []uint32{0}, []uint32{1})
	for range 2 {
		enc.Object("ns/app-1", `{"type":"model"}`, true, indexer.Meta{}, [][]indexer.Entry{{{Key: "m1", Value: "app-1"}}})
	}
	for i := range fillers {
		enc.Object(fmt.Sprintf("ns/filler-%06d", i), "", false, indexer.Meta{}, [][]indexer.Entry{{{Key: fmt.Sprintf("f-%06d", i), Value: "filler"}}})
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SnapshotFile), buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A subscriber that got its first answer from the tables hears of a key
// that the objects do not have: the rebuild names it.
func TestSubscriberOfATableOnlyKeyHearsItGo(t *testing.T) {
	dir := t.TempDir()
	craftedSnapshot(t, dir, 50000)
	e, err := newEngine(compiledPlan(t), Options{Logger: testLog(), SnapshotDir: dir}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := e.Subscribe(context.Background(), KeyOf("model-to-app", "ghost"))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var last []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		ev, err := sub.Next(ctx)
		cancel()
		if err == nil {
			last = ev.Values
			continue
		}
		if len(last) == 0 && len(e.Lookup("model-to-app", "ghost")) == 0 {
			return
		}
	}
	t.Errorf("the subscriber of a key only the table had still holds %q", last)
}

// recorder keeps every log record, as a buffering handler does.
type recorder struct {
	mu      gosync.Mutex
	records []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// Nothing logged while restoring points into the snapshot's data, which
// is unmapped once the objects are loaded.
func TestRestoreLogsOutliveTheMapping(t *testing.T) {
	dir := t.TempDir()
	craftedSnapshot(t, dir, 10)
	rec := &recorder{}
	e, err := newEngine(compiledPlan(t), Options{Logger: slog.New(rec), SnapshotDir: dir}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-watchersOf(e)[0].Loaded
	time.Sleep(200 * time.Millisecond) // the release
	rec.mu.Lock()
	defer rec.mu.Unlock()
	dup := false
	for _, r := range rec.records {
		r.Attrs(func(a slog.Attr) bool {
			s := a.Value.String() // reads every attribute
			dup = dup || s == "ns/app-1"
			return true
		})
	}
	if !dup {
		t.Error("the duplicate object was not logged")
	}
	if got := e.Lookup("model-to-app", "m1"); len(got) != 1 || got[0] != "app-1" {
		t.Errorf("m1 = %q after the load", got)
	}
}
