package sync

import (
	"bytes"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/iidp/metasync/sync/internal/follow"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	restclientwatch "k8s.io/client-go/rest/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/schema"
)

func testWatcher(t *testing.T) (*follow.Watcher, *indexer.Store) {
	t.Helper()
	e := testEngine(t, &schema.Config{Resources: []schema.Resource{{
		Name: "apps", Version: "v1", Resource: "apps",
		Fields:  map[string]string{"type": "spec.type", "tag": "v${spec.version}"},
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}})
	return watchersOf(e)[0], e.store
}

// testEngine compiles cfg and builds an engine of it as New does, without
// a cluster: its watchers have no client.
func testEngine(tb testing.TB, cfg *schema.Config) *Engine {
	tb.Helper()
	plan, err := schema.Compile(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e, err := newEngine(compiled.Of(plan), Options{Logger: testLog()}, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// watchersOf returns the watchers of the engine's current view.
func watchersOf(e *Engine) []*follow.Watcher {
	v, _ := e.view()
	return v.watchers
}

func testLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestProjection(t *testing.T) {
	w, store := testWatcher(t)
	o := w.Project(`{"metadata":{"name":"base","namespace":"ns","uid":"u1","resourceVersion":"7","labels":{"big":"x"}},
		"spec":{"type":"model","version":"1.7","models":["m1","m2"],"blob":"` + string(make([]byte, 0)) + `"}}`)
	if o.Ix.Key != "ns/base" || o.RV != "7" {
		t.Fatalf("meta = %q %q", o.Ix.Key, o.RV)
	}
	if m := o.GetObjectMeta(); m.GetName() != "base" || m.GetNamespace() != "ns" || m.GetResourceVersion() != "7" {
		t.Fatalf("GetObjectMeta = %v", m)
	}
	if err := w.Add(o); err != nil {
		t.Fatal(err)
	}
	ix, _ := store.Index("model-to-app")
	for _, k := range []string{"m1", "m2"} {
		if got := store.Snapshot().Lookup(ix, k); !slices.Equal(got, []string{"base"}) {
			t.Fatalf("%s = %v", k, got)
		}
	}
	if o.Ix.Payload != `{"tag":"v1.7","type":"model"}` {
		t.Fatalf("payload = %v", o.Ix.Payload)
	}
}

// TestTombstoneAndRecreate checks the store side of deletes: a
// DeletedFinalStateUnknown tombstone deletes by key, and a relist that
// brings a recreated object under the same name replaces the old one.
func TestTombstoneAndRecreate(t *testing.T) {
	w, store := testWatcher(t)
	ix, _ := store.Index("model-to-app")
	old := w.Project(`{"metadata":{"name":"a","namespace":"ns","uid":"1"},"spec":{"models":["m1"]}}`)
	if err := w.Add(old); err != nil {
		t.Fatal(err)
	}
	if err := w.Delete(cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: old}); err != nil {
		t.Fatal(err)
	}
	if got := store.Snapshot().Lookup(ix, "m1"); got != nil {
		t.Fatalf("after tombstone: %v", got)
	}
	if err := w.Add(old); err != nil {
		t.Fatal(err)
	}
	recreated := w.Project(`{"metadata":{"name":"a","namespace":"ns","uid":"2"},"spec":{"models":["m2"]}}`)
	if err := w.Replace([]any{recreated}, "10"); err != nil {
		t.Fatal(err)
	}
	snap := store.Snapshot()
	if snap.Lookup(ix, "m1") != nil || !slices.Equal(snap.Lookup(ix, "m2"), []string{"a"}) {
		t.Fatalf("after recreate: m1=%v m2=%v", snap.Lookup(ix, "m1"), snap.Lookup(ix, "m2"))
	}
	if err := w.Delete("not an object"); err == nil {
		t.Fatal("a delete of an unknown type was accepted")
	}
}

// TestWatchEventOutlivesItsBuffer: the stream decoder reuses its buffer
// for the next event, and an event's object is a view of that buffer
// until client-go's watch decoder has decoded it (at once, before it
// reads the next event). What an event decodes to must not change when
// the next one is read, nor when its bytes are overwritten.
func TestWatchEventOutlivesItsBuffer(t *testing.T) {
	w, store := testWatcher(t)
	stream := []byte(`{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"ns","resourceVersion":"7"},"spec":{"models":["m1"],"type":"t","version":"1"}}}
{"type":"MODIFIED","object":{"metadata":{"name":"b","namespace":"ns","resourceVersion":"8"},"spec":{"models":["m2"],"type":"u","version":"2"}}}
{"type" : "DELETED", "object" : {"metadata":{"name":"c","namespace":"ns","resourceVersion":"9"}}}
`)
	c := &follow.Codec{Project: w.Project}
	info := c.SupportedMediaTypes()[0].StreamSerializer
	frames := info.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(stream)))
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(frames, follow.WatchEventCodec{}), c)
	type got struct {
		typ watch.EventType
		obj runtime.Object
	}
	var events []got
	for {
		typ, obj, err := dec.Decode()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, got{typ, obj})
	}
	for i := range stream {
		stream[i] = 'x'
	}
	want := []struct {
		typ     watch.EventType
		key, rv string
	}{{watch.Added, "ns/a", "7"}, {watch.Modified, "ns/b", "8"}, {watch.Deleted, "ns/c", "9"}}
	if len(events) != len(want) {
		t.Fatalf("%d events, want %d", len(events), len(want))
	}
	for i, ev := range events {
		o := ev.obj.(*follow.Projected)
		if ev.typ != want[i].typ || o.Ix.Key != want[i].key || o.RV != want[i].rv {
			t.Errorf("event %d = %s %s@%s, want %s %s@%s", i, ev.typ, o.Ix.Key, o.RV, want[i].typ, want[i].key, want[i].rv)
		}
	}
	if err := w.Add(events[0].obj); err != nil {
		t.Fatal(err)
	}
	ix, _ := store.Index("model-to-app")
	if got := store.Snapshot().Lookup(ix, "m1"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("m1 = %v after the buffer changed, want [a]", got)
	}
}
