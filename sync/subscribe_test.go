package sync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/iidp/metasync/schema"
)

// routingEngine is an engine without a cluster of models -> apps -> addresses.
func routingEngine(tb testing.TB) (*Engine, *Feed) {
	tb.Helper()
	e := testEngine(tb, &schema.Config{
		Resources: []schema.Resource{
			{Name: "apps", Version: "v1", Resource: "apps",
				Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}}},
			{Name: "slices", Version: "v1", Resource: "slices",
				Indexes: []schema.Index{{Name: "app-to-addresses", Key: "metadata.labels.app", Value: "addresses"}}},
		},
		Chains: []schema.Chain{{Name: "model-to-addresses", Indexes: []string{"model-to-app", "app-to-addresses"}}},
	})
	for _, w := range watchersOf(e) {
		if err := w.Replace(nil, ""); err != nil {
			tb.Fatal(err)
		}
	}
	return e, &Feed{e: e}
}

func appJSON(name string, models ...string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": name}, "spec": map[string]any{"models": models}})
	return b
}

func sliceJSON(name, app string, addresses ...string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": name, "labels": map[string]string{"app": app}}, "addresses": addresses})
	return b
}

func next(t *testing.T, s *Subscription) Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ev, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return ev
}

func noEvent(t *testing.T, s *Subscription) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if ev, err := s.Next(ctx); err == nil {
		t.Fatalf("unexpected event %+v", ev)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestSubscribeChainFollowsEveryStep(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("apps", appJSON("base", "model1")))
	must(t, f.Apply("slices", sliceJSON("base-1", "base", "10.0.0.5")))
	sub, err := e.Subscribe(context.Background(), ChainOf("model-to-addresses", "model1"))
	must(t, err)
	defer sub.Close()
	want := func(typ EventType, values ...string) {
		t.Helper()
		ev := next(t, sub)
		if ev.Type != typ || !slices.Equal(ev.Values, values) || ev.Key != "model1" {
			t.Fatalf("event %+v, want %v %v", ev, typ, values)
		}
	}
	want(EventSnapshot, "10.0.0.5")
	if !sub.HasSynced() {
		t.Fatal("not synced after the snapshot")
	}
	must(t, f.Apply("slices", sliceJSON("base-1", "base", "10.0.0.5", "10.0.0.6"))) // the app's addresses
	want(EventUpdate, "10.0.0.5", "10.0.0.6")
	must(t, f.Apply("slices", sliceJSON("other-1", "other", "10.0.9.9"))) // another app: nothing
	noEvent(t, sub)
	must(t, f.Apply("apps", appJSON("other", "model1"))) // another app claims the model
	want(EventUpdate, "10.0.0.5", "10.0.0.6", "10.0.9.9")
	must(t, f.Apply("apps", appJSON("base", "model2"))) // base drops it
	want(EventUpdate, "10.0.9.9")
	must(t, f.Apply("slices", sliceJSON("base-1", "base", "10.0.0.7"))) // base is off the path now
	noEvent(t, sub)
	must(t, f.Delete("apps", "other"))
	want(EventUpdate)
}

func TestSubscribeIndexAndResume(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("apps", appJSON("a", "m1", "m2")))
	sub, err := e.Subscribe(context.Background(), IndexOf("model-to-app"))
	must(t, err)
	got := map[string][]string{}
	var version string
	for {
		ev := next(t, sub)
		if ev.Type == EventSynced {
			version = ev.Version
			break
		}
		if ev.Type != EventSnapshot {
			t.Fatalf("before synced: %+v", ev)
		}
		got[ev.Key] = ev.Values
	}
	if len(got) != 2 || !slices.Equal(got["m1"], []string{"a"}) {
		t.Fatalf("snapshot = %v", got)
	}
	sub.Close()
	if _, err := sub.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}

	// While away: m1 changes and changes back (nothing to send), m2 goes,
	// m3 comes.
	must(t, f.Apply("apps", appJSON("a", "m1")))
	must(t, f.Apply("apps", appJSON("b", "m3")))
	must(t, f.Apply("apps", appJSON("c", "m1")))
	must(t, f.Delete("apps", "c"))
	sub, err = e.Subscribe(context.Background(), Target{Index: "model-to-app", All: true, Resume: version})
	must(t, err)
	var updates []string
	for {
		ev := next(t, sub)
		if ev.Type == EventSynced {
			break
		}
		if ev.Type != EventUpdate {
			t.Fatalf("resume: %+v", ev)
		}
		updates = append(updates, ev.Key+"="+strings.Join(ev.Values, ","))
	}
	if !slices.Equal(updates, []string{"m2=", "m3=b"}) {
		t.Fatalf("resume sent %v, want [m2= m3=b]", updates)
	}
	sub.Close()

	// Versions of another run, and key versions, cannot resume an index.
	for _, v := range []string{"ffffffff:1", "garbage", version + ":x"} {
		sub, err = e.Subscribe(context.Background(), Target{Index: "model-to-app", All: true, Resume: v})
		must(t, err)
		if ev := next(t, sub); ev.Type != EventReset {
			t.Fatalf("resume from %q: %+v, want a reset", v, ev)
		}
		if ev := next(t, sub); ev.Type != EventSnapshot {
			t.Fatalf("after a reset: %+v, want snapshots", ev)
		}
		sub.Close()
	}
}

func TestSubscribeKeyResume(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("apps", appJSON("a", "m1")))
	sub, err := e.Subscribe(context.Background(), KeyOf("model-to-app", "m1"))
	must(t, err)
	ev := next(t, sub)
	sub.Close()
	// Unchanged: a resume sends nothing.
	sub, err = e.Subscribe(context.Background(), Target{Index: "model-to-app", Key: "m1", Resume: ev.Version})
	must(t, err)
	noEvent(t, sub)
	if !sub.HasSynced() {
		t.Fatal("a resume with nothing to send is synced")
	}
	sub.Close()
	// Changed and changed back: nothing either; changed: one update.
	must(t, f.Apply("apps", appJSON("b", "m1")))
	must(t, f.Delete("apps", "b"))
	sub, _ = e.Subscribe(context.Background(), Target{Index: "model-to-app", Key: "m1", Resume: ev.Version})
	noEvent(t, sub)
	sub.Close()
	must(t, f.Apply("apps", appJSON("b", "m1")))
	sub, _ = e.Subscribe(context.Background(), Target{Index: "model-to-app", Key: "m1", Resume: ev.Version})
	if got := next(t, sub); got.Type != EventUpdate || !slices.Equal(got.Values, []string{"a", "b"}) {
		t.Fatalf("resume after a change: %+v", got)
	}
	sub.Close()
	sub, _ = e.Subscribe(context.Background(), Target{Index: "model-to-app", Key: "m1", Resume: "nope"})
	if got := next(t, sub); got.Type != EventReset {
		t.Fatalf("resume from garbage: %+v", got)
	}
	if got := next(t, sub); got.Type != EventSnapshot {
		t.Fatalf("after the reset: %+v", got)
	}
	sub.Close()
}

func TestSubscribeWaitsForSyncAndUnknownTargets(t *testing.T) {
	e := testEngine(t, &schema.Config{Resources: []schema.Resource{{Name: "apps", Version: "v1", Resource: "apps",
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}}}}})
	for _, target := range []Target{KeyOf("nope", "k"), ChainOf("nope", "k"), IndexOf("nope"), {}} {
		if _, err := e.Subscribe(context.Background(), target); err == nil {
			t.Errorf("Subscribe(%+v): no error", target)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := e.Subscribe(ctx, KeyOf("model-to-app", "m1"))
	must(t, err)
	noEvent(t, sub) // not synced: no answer yet
	must(t, watchersOf(e)[0].Replace([]any{watchersOf(e)[0].Project(string(appJSON("a", "m1")))}, ""))
	if ev := next(t, sub); ev.Type != EventSnapshot || !slices.Equal(ev.Values, []string{"a"}) {
		t.Fatalf("after the sync: %+v", ev)
	}
	cancel()
	if _, err := sub.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("after the context ended: %v", err)
	}
	openAfter(t, e, 0)
}

// TestSubscriptionsModel: random writes (adds, updates, deletes, relists)
// with many subscribers, some slow, some cancelled midway. Every answer a
// subscriber gets is the answer at its version; versions never go back; no
// update repeats the previous answer; at the end every subscriber that
// was not cancelled holds Lookup's or Resolve's answer.
func TestSubscriptionsModel(t *testing.T) {
	e, f := routingEngine(t)
	rng := rand.New(rand.NewPCG(1, 2))
	models := []string{"m0", "m1", "m2", "m3", "m4"}
	apps := []string{"a0", "a1", "a2", "a3"}
	addrs := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}
	pick := func(from []string) []string {
		var out []string
		for _, s := range from {
			if rng.IntN(3) == 0 {
				out = append(out, s)
			}
		}
		return out
	}

	// history[seq] is every answer after the commit of seq.
	var mu gosync.Mutex
	history := map[uint64]modelAnswers{}
	record := func() {
		snap := e.store.Snapshot()
		st := modelAnswers{keys: map[string][]string{}, chain: map[string][]string{}, index: map[string][]string{}}
		for _, m := range models {
			st.keys[m] = e.Lookup("model-to-app", m)
			st.chain[m] = e.Resolve("model-to-addresses", m)
		}
		for _, k := range e.Keys("model-to-app") {
			st.index[k] = e.Lookup("model-to-app", k)
		}
		mu.Lock()
		if _, ok := history[snap.Seq()]; !ok { // the first record of a seq is the writer's
			history[snap.Seq()] = st
		}
		mu.Unlock()
	}
	record()
	answersAt := func(seq uint64) (modelAnswers, bool) {
		mu.Lock()
		defer mu.Unlock()
		st, ok := history[seq]
		return st, ok
	}

	const subscribers = 60
	results := make([]*modelSubscriber, subscribers)
	var wg gosync.WaitGroup
	ctx, stopAll := context.WithCancel(context.Background())
	defer stopAll()
	done := make(chan struct{})
	for i := range subscribers {
		var target Target
		switch i % 3 {
		case 0:
			target = KeyOf("model-to-app", models[i%len(models)])
		case 1:
			target = ChainOf("model-to-addresses", models[i%len(models)])
		default:
			target = IndexOf("model-to-app")
		}
		r := &modelSubscriber{target: target, last: map[string][]string{}}
		results[i] = r
		subCtx, cancel := context.WithCancel(ctx)
		sub, err := e.Subscribe(subCtx, target)
		must(t, err)
		slow := i%4 == 0
		cancelAfter := -1
		if i%7 == 0 {
			cancelAfter = 5 + i
		}
		wg.Go(func() { r.follow(sub, cancel, slow, cancelAfter, done, answersAt) })
	}

	for range 600 {
		switch n := rng.IntN(10); {
		case n < 4:
			must(t, f.Apply("apps", appJSON(apps[rng.IntN(len(apps))], pick(models)...)))
		case n < 7:
			a := apps[rng.IntN(len(apps))]
			must(t, f.Apply("slices", sliceJSON(a+"-"+strconv.Itoa(rng.IntN(2)), a, pick(addrs)...)))
		case n < 8:
			must(t, f.Delete("apps", apps[rng.IntN(len(apps))]))
		case n < 9:
			var objs [][]byte
			for _, a := range pick(apps) {
				objs = append(objs, appJSON(a, pick(models)...))
			}
			must(t, f.Replace("apps", objs...))
		default:
			var objs [][]byte
			for _, a := range pick(apps) {
				objs = append(objs, sliceJSON(a+"-0", a, pick(addrs)...))
			}
			must(t, f.Replace("slices", objs...))
		}
		record()
		if rng.IntN(50) == 0 {
			runtime.Gosched()
		}
	}
	// Let the subscribers catch up (see above), then check their answers.
	close(done)
	wg.Wait()
	stopAll()
	for i, r := range results {
		if r.err != nil {
			t.Errorf("subscriber %d (%+v): %v", i, r.target, r.err)
			continue
		}
		if r.cancelled {
			continue
		}
		r.check(t, e, i)
	}
	openAfter(t, e, 0)
}

// modelAnswers are the answers of the engine of TestSubscriptionsModel
// after one commit: of each model's key, its chain, and the whole index.
type modelAnswers struct{ keys, chain, index map[string][]string }

// modelSubscriber is one subscriber of TestSubscriptionsModel and what it
// has seen.
type modelSubscriber struct {
	target    Target
	last      map[string][]string
	lastSeq   uint64
	cancelled bool
	err       error
}

// follow takes the events of sub until the writes are over (done) and it
// has caught up, or until its end. It cancels its subscription after
// cancelAfter events (never if -1), sleeps a little after each event if
// slow, and checks each event against answersAt, the answers after the
// commit of a seq: the first thing it finds wrong is r.err.
func (r *modelSubscriber) follow(sub *Subscription, cancel context.CancelFunc, slow bool, cancelAfter int, done <-chan struct{}, answersAt func(uint64) (modelAnswers, bool)) {
	defer cancel()
	fail := func(format string, args ...any) {
		if r.err == nil {
			r.err = fmt.Errorf(format, args...)
		}
	}
	for n := 0; ; n++ {
		if n == cancelAfter {
			r.cancelled = true
			cancel()
		}
		// A Next that waits 300 ms for nothing, once the writes are over,
		// finds nothing left to take: the subscriber has caught up.
		nctx, ncancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		ev, err := sub.Next(nctx)
		ncancel()
		if errors.Is(err, context.DeadlineExceeded) {
			select {
			case <-done:
				return
			default:
				n--
				continue
			}
		}
		if err != nil {
			if !errors.Is(err, ErrClosed) || !r.cancelled {
				fail("Next: %v", err)
			}
			return
		}
		if slow {
			time.Sleep(time.Duration(n%3) * time.Millisecond)
		}
		parts := strings.Split(ev.Version, ":")
		seq, _ := strconv.ParseUint(parts[1], 10, 64)
		if seq < r.lastSeq {
			fail("version went back: %d after %d", seq, r.lastSeq)
		}
		r.lastSeq = seq
		if ev.Type == EventSynced {
			continue
		}
		if prev, ok := r.last[ev.Key]; ok && ev.Type == EventUpdate && slices.Equal(prev, ev.Values) {
			fail("update %s repeats %v", ev.Key, prev)
		}
		r.last[ev.Key] = ev.Values
		if len(parts) == 3 && parts[2] != "partial" { // a key or chain answer is the one at its version
			st, ok := answersAt(seq)
			want := st.keys[ev.Key]
			if r.target.Chain != "" {
				want = st.chain[ev.Key]
			}
			if ok && !slices.Equal(want, ev.Values) {
				fail("%s at %d: %v, want %v", ev.Key, seq, ev.Values, want)
			}
		}
	}
}

// check: a subscriber of TestSubscriptionsModel, number i, holds what e
// answers at the end.
func (r *modelSubscriber) check(t *testing.T, e *Engine, i int) {
	switch {
	case r.target.All:
		want := map[string][]string{}
		for _, k := range e.Keys("model-to-app") {
			want[k] = e.Lookup("model-to-app", k)
		}
		got := map[string][]string{}
		for k, v := range r.last {
			if len(v) > 0 {
				got[k] = v
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("subscriber %d mirrors %v, want %v", i, got, want)
		}
	case r.target.Chain != "":
		if got, want := r.last[r.target.Key], e.Resolve(r.target.Chain, r.target.Key); !slices.Equal(got, want) {
			t.Errorf("subscriber %d: %s = %v, want %v", i, r.target.Key, got, want)
		}
	default:
		if got, want := r.last[r.target.Key], e.Lookup(r.target.Index, r.target.Key); !slices.Equal(got, want) {
			t.Errorf("subscriber %d: %s = %v, want %v", i, r.target.Key, got, want)
		}
	}
}

// openAfter waits for the open subscriptions to be n: a context's end
// closes its subscription from a goroutine of its own.
func openAfter(t *testing.T, e *Engine, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); e.Inspect().Subscriptions().Open != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscriptions open, want %d", e.Inspect().Subscriptions().Open, n)
		}
	}
}

// TestResumeOutsideTheJournal: a version older than what the index's
// journal holds cannot be resumed from: a reset, then a full snapshot.
func TestResumeOutsideTheJournal(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("apps", appJSON("a", "m0")))
	sub, err := e.Subscribe(context.Background(), IndexOf("model-to-app"))
	must(t, err)
	var version string
	for ev := next(t, sub); ; ev = next(t, sub) {
		if ev.Type == EventSynced {
			version = ev.Version
			break
		}
	}
	sub.Close()
	// Each apply moves app a to a new model: two changed keys.
	for i := 1; i <= journalSize/2+1; i++ {
		must(t, f.Apply("apps", appJSON("a", "m"+strconv.Itoa(i))))
	}
	sub, err = e.Subscribe(context.Background(), Target{Index: "model-to-app", All: true, Resume: version})
	must(t, err)
	defer sub.Close()
	if ev := next(t, sub); ev.Type != EventReset {
		t.Fatalf("resume from before the journal: %+v, want a reset", ev)
	}
	want := "m" + strconv.Itoa(journalSize/2+1)
	if ev := next(t, sub); ev.Type != EventSnapshot || ev.Key != want {
		t.Fatalf("after the reset: %+v, want the snapshot of %s", ev, want)
	}
	if ev := next(t, sub); ev.Type != EventSynced {
		t.Fatalf("after the snapshot: %+v", ev)
	}
	if n := e.Inspect().Subscriptions().Resets; n != 1 {
		t.Fatalf("resets = %d, want 1", n)
	}
}

// TestLargeCommitIndexSubscription: a relist that changes more keys than
// an index subscription keeps track of one by one (the hub marks it to
// compare the whole index, and the journal lets go of what it held)
// still brings the subscriber exactly the index's new state, and a resume
// from before the relist is a reset, one from after it a resume.
func TestLargeCommitIndexSubscription(t *testing.T) {
	e, f := routingEngine(t)
	for i := range 50 {
		must(t, f.Apply("apps", appJSON("old-"+strconv.Itoa(i), "m-old-"+strconv.Itoa(i))))
	}
	sub, err := e.Subscribe(context.Background(), IndexOf("model-to-app"))
	must(t, err)
	defer sub.Close()
	held := map[string][]string{}
	var before string
	for ev := next(t, sub); ; ev = next(t, sub) {
		if ev.Type == EventSynced {
			before = ev.Version
			break
		}
		held[ev.Key] = ev.Values
	}
	n := max(pendingMax, journalSize) + 100
	objs := make([][]byte, n)
	for i := range objs {
		objs[i] = appJSON("new-"+strconv.Itoa(i), "m-new-"+strconv.Itoa(i), "m-old-"+strconv.Itoa(i%10))
	}
	must(t, f.Replace("apps", objs...))
	want := map[string][]string{}
	snap := e.store.Snapshot()
	ix, _ := snap.Index("model-to-app")
	for _, k := range snap.Keys(ix) {
		want[k] = snap.Lookup(ix, k)
	}
	var after string
	for !maps.EqualFunc(held, want, slices.Equal[[]string]) {
		ev := next(t, sub)
		if ev.Type != EventUpdate {
			t.Fatalf("after the relist: %+v, want updates", ev)
		}
		if len(ev.Values) == 0 {
			delete(held, ev.Key)
		} else {
			held[ev.Key] = ev.Values
		}
		after = ev.Version
	}
	noEvent(t, sub)
	if len(held) != n+10 { // and m-old-0 to m-old-9
		t.Fatalf("subscriber holds %d keys, want %d", len(held), n+10)
	}
	resume := func(version string) *Subscription {
		s, err := e.Subscribe(context.Background(), Target{Index: "model-to-app", All: true, Resume: version})
		must(t, err)
		t.Cleanup(s.Close)
		return s
	}
	if ev := next(t, resume(before)); ev.Type != EventReset {
		t.Fatalf("resume from before the relist: %+v, want a reset", ev)
	}
	if ev := next(t, resume(after)); ev.Type != EventSynced {
		t.Fatalf("resume from after the relist: %+v, want synced at once", ev)
	}
}
