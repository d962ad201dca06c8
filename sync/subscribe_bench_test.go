package sync

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"

	"github.com/iidp/metasync/schema"
)

// toggleEvent is a watch event as the apiserver sends it for AppModel
// app-<i> written by server-side apply (as appModelEvent), with its three
// models and, when hot, the model "hot" too.
func toggleEvent(i, rv int, hot bool) string {
	models := fmt.Sprintf(`"model-%06d-0","model-%06d-1","model-%06d-2"`, i, i, i)
	if hot {
		models += `,"hot"`
	}
	return fmt.Sprintf(`{"type":"MODIFIED","object":{"apiVersion":"iidp.com/v1","kind":"AppModel","metadata":{"creationTimestamp":"2026-11-29T22:44:50Z","generation":2,"labels":{"iidp":"iidp"},"managedFields":[{"apiVersion":"iidp.com/v1","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{"f:iidp":{}}},"f:spec":{"f:models":{},"f:type":{},"f:version":{}}},"manager":"bench","operation":"Apply","time":"2026-11-29T22:44:50Z"}],"name":"app-%06d","namespace":"bench","resourceVersion":"%d","uid":"4f1c2a8e-0d7b-4a51-9d3e-%012d"},"spec":{"models":[%s],"type":"model","version":"1.0.0"}}}`+"\n", i, rv, i, models)
}

// eventRig is BenchmarkWatchEvent's setup with subscribers: an engine of
// 10,000 AppModels, synced, and a watch stream of events that each change
// exactly one index key (event 2k adds the model "hot" to AppModel k×7 mod
// 10,000, event 2k+1 takes it away again), decoded and applied as the
// engine's watch does.
type eventRig struct {
	e      *Engine
	w      *follow.Watcher
	c      *follow.Codec
	stream []byte
	dec    streaming.Decoder
	cancel context.CancelFunc
	// delivered counts the events that the drained subscriber of "hot"
	// took, if any; drained is closed when it stops.
	delivered atomic.Int64
	drained   chan struct{}
}

// newEventRig builds a rig with key subscriptions on others keys that no
// event changes (model-<i>-0), each registered by taking its snapshot,
// and, when changed, one on the key "hot" that every event changes,
// drained by a goroutine of its own.
func newEventRig(tb testing.TB, others int, changed bool) *eventRig {
	e := testEngine(tb, &schema.Config{Resources: []schema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}})
	r := &eventRig{e: e, w: watchersOf(e)[0], drained: make(chan struct{})}
	const n = 10_000
	objs := make([]any, n)
	for i := range n {
		ev := toggleEvent(i, 1_000_000+i, false)
		objs[i] = r.w.Project(ev[len(`{"type":"MODIFIED","object":`) : len(ev)-2])
	}
	if err := r.w.Replace(objs, ""); err != nil { // synced: subscriptions start
		tb.Fatal(err)
	}
	var stream bytes.Buffer
	for i := range 4096 {
		stream.WriteString(toggleEvent(i/2*7%n, 100+i, i%2 == 0))
	}
	r.stream = stream.Bytes()
	r.c = &follow.Codec{Project: r.w.Project}

	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	for i := range others {
		sub, err := e.Subscribe(ctx, KeyOf("model-to-app", fmt.Sprintf("model-%06d-0", i)))
		if err != nil {
			tb.Fatal(err)
		}
		if ev, err := sub.Next(ctx); err != nil || ev.Type != EventSnapshot { // registers it
			tb.Fatalf("first event %+v, %v", ev, err)
		}
	}
	if !changed {
		close(r.drained)
		return r
	}
	sub, err := e.Subscribe(ctx, KeyOf("model-to-app", "hot"))
	if err != nil {
		tb.Fatal(err)
	}
	if ev, err := sub.Next(ctx); err != nil || ev.Type != EventSnapshot {
		tb.Fatalf("first event %+v, %v", ev, err)
	}
	go func() {
		defer close(r.drained)
		for {
			if _, err := sub.Next(ctx); err != nil {
				return
			}
			r.delivered.Add(1)
		}
	}()
	return r
}

// events decodes and applies the next count events of the stream, from
// its start again at its end.
func (r *eventRig) events(tb testing.TB, count int) {
	for i := 0; i < count; {
		if r.dec == nil {
			info := r.c.SupportedMediaTypes()[0].StreamSerializer
			frames := info.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(r.stream)))
			r.dec = streaming.NewDecoder(frames, info.Serializer)
		}
		var ev metav1.WatchEvent
		if _, _, err := r.dec.Decode(nil, &ev); err == io.EOF {
			r.dec = nil
			continue
		} else if err != nil {
			tb.Fatal(err)
		}
		obj, _, err := r.c.Decode(ev.Object.Raw, nil, nil)
		if err != nil {
			tb.Fatal(err)
		}
		if err := r.w.Update(obj); err != nil {
			tb.Fatal(err)
		}
		i++
	}
}

// stop ends the rig's subscriptions and checks its state.
func (r *eventRig) stop(tb testing.TB, others int) {
	if open := r.e.Inspect().Subscriptions().Open; open < int64(others) {
		tb.Fatalf("%d subscriptions open, want %d at least", open, others)
	}
	if hot := r.e.Lookup("model-to-app", "hot"); len(hot) > 1 || (len(hot) == 1 && !strings.HasPrefix(hot[0], "app-")) {
		tb.Fatalf("hot = %v", hot)
	}
	r.cancel()
	<-r.drained
}

// BenchmarkWatchEventSubscribers is BenchmarkWatchEvent's work (an
// engine's work for one watch event, from the stream's bytes to the
// commit, on a source of 10,000 AppModels) for events that each change one
// index key (see eventRig), with subscribers: none; 10,000 key
// subscriptions on keys that the events do not change (a write costs in
// proportion to the subscribers of the keys it changes, not to all
// subscribers: compare the two); and, for reference, one subscription on
// the key that every event changes, drained by a goroutine of its own (its
// events/op is how many events it took per write: changes coalesce when
// it falls behind, and this key's answer toggles, so most coalesced
// changes come back to the answer it already has). GCs/1000op counts the
// garbage collections: 10,000 subscriptions make the live heap about four
// times larger, so the collector runs less often, which separate runs
// cannot tell apart from the subscriptions' own cost;
// BenchmarkWatchEventSubscribersPaired can.
//
//	go test -run '^$' -bench WatchEventSubscribers -benchmem -count 8 ./sync/ | tee subs.txt
//	benchstat -col /subscribers -filter '.name:WatchEventSubscribers' subs.txt
//	benchstat -filter '.name:WatchEventSubscribersPaired' subs.txt
func BenchmarkWatchEventSubscribers(b *testing.B) {
	for _, bc := range []struct {
		name    string
		others  int  // key subscriptions on keys no event changes
		changed bool // one subscription on "hot", drained
	}{
		{name: "subscribers=0"},
		{name: "subscribers=10000", others: 10_000},
		{name: "subscribers=1-on-changed-key", changed: true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := newEventRig(b, bc.others, bc.changed)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ReportAllocs()
			b.ResetTimer()
			r.events(b, b.N)
			b.StopTimer()
			runtime.ReadMemStats(&after)
			// The subscriptions make the live heap larger, so the
			// collector runs less often: this tells that apart.
			b.ReportMetric(float64(after.NumGC-before.NumGC)*1000/float64(b.N), "GCs/1000op")
			if bc.changed {
				b.ReportMetric(float64(r.delivered.Load())/float64(b.N), "events/op")
			}
			r.stop(b, bc.others)
		})
	}
}

// BenchmarkWatchEventSubscribersPaired times the same events on two
// engines in one process, one without subscribers and one with 10,000 key
// subscriptions on keys that the events do not change, in alternating
// blocks of 32 events each (which goes first alternating too): the
// machine's drift and the garbage collector (one heap, one pace) weigh on
// both alike, which separate runs cannot ensure (10,000 subscriptions make
// the heap four times larger, and the collector then runs less often). It
// reports each one's median time per event over its blocks (a block that
// another process's time slice or a GC pause fell on does not move a
// median) and their ratio; ns/op is the mean of both.
func BenchmarkWatchEventSubscribersPaired(b *testing.B) {
	const others, block = 10_000, 32
	none, many := newEventRig(b, 0, false), newEventRig(b, others, false)
	var tNone, tMany []float64 // ns per event, per block
	run := func(r *eventRig, k int, ts *[]float64) {
		start := time.Now()
		r.events(b, k)
		*ts = append(*ts, float64(time.Since(start).Nanoseconds())/float64(k))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for done, round := 0, 0; done < b.N; round++ {
		k := min(2*block, b.N-done)
		kNone, kMany := (k+1)/2, k/2
		if round%2 == 1 && kMany > 0 {
			run(many, kMany, &tMany)
			run(none, kNone, &tNone)
		} else {
			run(none, kNone, &tNone)
			if kMany > 0 {
				run(many, kMany, &tMany)
			}
		}
		done += k
	}
	b.StopTimer()
	if len(tNone) > 0 && len(tMany) > 0 {
		median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
		perNone, perMany := median(tNone), median(tMany)
		b.ReportMetric(perNone, "ns/event-subscribers=0")
		b.ReportMetric(perMany, "ns/event-subscribers=10000")
		b.ReportMetric(perMany/perNone, "ratio")
	}
	none.stop(b, 0)
	many.stop(b, others)
}
