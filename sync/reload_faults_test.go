package sync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/iidp/metasync/schema"
)

// drainAll takes events until quiet, returning key->values updates.
func drainAll(t *testing.T, s *Subscription) []Event {
	t.Helper()
	var out []Event
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		ev, err := s.Next(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		out = append(out, ev)
	}
}

// heldS1Answered checks that an index subscriber that held s1=[10.9.9.9]
// and then took evs (a reset drops what it held) holds what the store
// answers for s1.
func heldS1Answered(t *testing.T, e *Engine, evs []Event) {
	t.Helper()
	holds := map[string][]string{"s1": {"10.9.9.9"}}
	for _, ev := range evs {
		t.Logf("event %v %q %v %s", ev.Type, ev.Key, ev.Values, ev.Version)
		if ev.Type == EventReset {
			holds = map[string][]string{}
		}
		if ev.Key != "" {
			holds[ev.Key] = ev.Values
		}
	}
	if !slices.Equal(holds["s1"], e.Lookup("svc", "s1")) {
		t.Fatalf("index subscriber holds s1=%v, store answers %v", holds["s1"], e.Lookup("svc", "s1"))
	}
}

// TestReloadDropFallbackWriteInWindow: a reload drops the fallback
// that alone answers s1; a write to another key of the same index lands
// between the store's Reconfigure and hub.reconfigure. The caught-up index
// subscriber must still hear s1 -> nothing.
func TestReloadDropFallbackWriteInWindow(t *testing.T) {
	e, f, obj := fallbackOnly(t)
	all := syncedIndexSub(t, e)
	obj2 := endpointsJSON("s2", map[string]any{"v": []string{"10.1.1.1"}})
	testHookPublished = func() {
		if err := f.Apply("eps", obj2); err != nil {
			t.Errorf("apply in window: %v", err)
		}
	}
	defer func() { testHookPublished = nil }()
	plan, err := schema.Compile(companionsConfig(false, false))
	must(t, err)
	_, err = e.Reload(plan)
	must(t, err)
	testHookPublished = nil
	must(t, f.Replace("eps", obj, obj2))
	testHookPublished = nil
	t.Logf("lookup s1 now: %v", e.Lookup("svc", "s1"))
	heldS1Answered(t, e, drainAll(t, all))
}

// TestReloadDropFallbackCompactInWindow: as above, with a Compact
// (the memory limit's) in the window instead of a write.
func TestReloadDropFallbackCompactInWindow(t *testing.T) {
	e, f, obj := fallbackOnly(t)
	all := syncedIndexSub(t, e)
	for i := range 100 {
		must(t, f.Apply("eps", endpointsJSON("churn", map[string]any{"v": []string{fmt.Sprint(i)}})))
	}
	must(t, f.Delete("eps", "churn"))
	drainAll(t, all)
	testHookPublished = func() { t.Logf("compact: %v", e.Inspect().Compact()) }
	defer func() { testHookPublished = nil }()
	plan, err := schema.Compile(companionsConfig(false, false))
	must(t, err)
	_, err = e.Reload(plan)
	must(t, err)
	testHookPublished = nil
	must(t, f.Replace("eps", obj))
	heldS1Answered(t, e, drainAll(t, all))
}

// TestSmallCommitLeavesHotKeyFollowers: many subscribers on one hot key;
// a commit of two other keys of the index marks none of them (a commit
// marks every key subscription of an index only when it has more keys
// than the index has registrations).
func TestSmallCommitLeavesHotKeyFollowers(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("apps", appJSON("a", "hot")))
	const n = 1000
	subs := make([]*Subscription, n)
	for i := range subs {
		s, err := e.Subscribe(context.Background(), KeyOf("model-to-app", "hot"))
		must(t, err)
		defer s.Close()
		next(t, s)
		subs[i] = s
	}
	before := e.hub.coalesced.Load()
	must(t, f.Apply("apps", appJSON("b", "x1", "x2")))
	dirty := 0
	for _, s := range subs {
		s.mu.Lock()
		if s.dirty {
			dirty++
		}
		s.mu.Unlock()
	}
	t.Logf("subscribers of 'hot' marked by a commit of keys x1,x2: %d of %d (coalesced +%d)", dirty, n, e.hub.coalesced.Load()-before)
	if dirty > 0 {
		t.Errorf("%d subscribers of an unchanged key marked", dirty)
	}
}

// TestResumeAcrossFallbackDrop: an index subscriber holds s1 from
// the fallback at version V; a reload drops the fallback; a new
// subscription resuming from V must learn that s1 answers nothing now.
func TestResumeAcrossFallbackDrop(t *testing.T) {
	e, f, obj := fallbackOnly(t)
	all, err := e.Subscribe(context.Background(), IndexOf("svc"))
	must(t, err)
	var v string
	for ev := next(t, all); ; ev = next(t, all) {
		if ev.Type == EventSynced {
			v = ev.Version
			break
		}
	}
	all.Close()
	plan, err := schema.Compile(companionsConfig(false, false))
	must(t, err)
	_, err = e.Reload(plan)
	must(t, err)
	must(t, f.Replace("eps", obj))
	t.Logf("lookup s1 now: %v", e.Lookup("svc", "s1"))
	tg := IndexOf("svc")
	tg.Resume = v
	re, err := e.Subscribe(context.Background(), tg)
	must(t, err)
	defer re.Close()
	heldS1Answered(t, e, drainAll(t, re))
}

func companionsConfigNamed(res string, fallback bool) *schema.Config {
	c := companionsConfig(fallback, false)
	c.Resources[0].Name = res
	return c
}

// TestRebindThenFallbackDrop: a reload moves the index to another
// resource (a new index id: the subscription rebinds and is registered
// with no shared snapshot, is.at nil); a second reload drops its
// fallback: the index subscriber must hear s1 -> nothing.
func TestRebindThenFallbackDrop(t *testing.T) {
	e := testEngine(t, companionsConfigNamed("eps", true))
	for _, w := range watchersOf(e) {
		must(t, w.Replace(nil, ""))
	}
	f := &Feed{e: e}
	obj := endpointsJSON("s1", map[string]any{"f": []string{"10.9.9.9"}})
	must(t, f.Apply("eps", obj))
	all, err := e.Subscribe(context.Background(), IndexOf("svc"))
	must(t, err)
	defer all.Close()
	holds := map[string][]string{}
	take := func(what string) {
		for _, ev := range drainAll(t, all) {
			t.Logf("%s: event %v %q %v %s", what, ev.Type, ev.Key, ev.Values, ev.Version)
			if ev.Key != "" {
				holds[ev.Key] = ev.Values
			}
		}
	}
	take("initial")
	reload := func(cfg *schema.Config) {
		plan, err := schema.Compile(cfg)
		must(t, err)
		_, err = e.Reload(plan)
		must(t, err)
	}
	reload(companionsConfigNamed("eps2", true))
	must(t, f.Replace("eps2", obj))
	take("after move")
	if h := e.hub.indexes[all.ix]; h != nil {
		t.Logf("after the move: is.at nil = %v", h.at == nil)
	}
	reload(companionsConfigNamed("eps2", false))
	must(t, f.Replace("eps2", obj))
	take("after drop")
	if !slices.Equal(holds["s1"], e.Lookup("svc", "s1")) {
		t.Fatalf("index subscriber holds s1=%v, store answers %v", holds["s1"], e.Lookup("svc", "s1"))
	}
}

// TestRebindTwiceNoDuplicate: two reloads each move the index to
// another resource; after the second the subscriber must not be sent
// values it holds already.
func TestRebindTwiceNoDuplicate(t *testing.T) {
	e := testEngine(t, companionsConfigNamed("eps", false))
	for _, w := range watchersOf(e) {
		must(t, w.Replace(nil, ""))
	}
	f := &Feed{e: e}
	obj := endpointsJSON("s1", map[string]any{"v": []string{"10.9.9.9"}})
	must(t, f.Apply("eps", obj))
	all, err := e.Subscribe(context.Background(), IndexOf("svc"))
	must(t, err)
	defer all.Close()
	holds := map[string][]string{}
	take := func(what string) {
		for _, ev := range drainAll(t, all) {
			t.Logf("%s: event %v %q %v %s", what, ev.Type, ev.Key, ev.Values, ev.Version)
			if ev.Type == EventUpdate && slices.Equal(holds[ev.Key], ev.Values) {
				t.Errorf("%s: update %q %v: the subscriber holds these values", what, ev.Key, ev.Values)
			}
			if ev.Key != "" {
				holds[ev.Key] = ev.Values
			}
		}
	}
	take("initial")
	for i, name := range []string{"eps2", "eps3"} {
		plan, err := schema.Compile(companionsConfigNamed(name, false))
		must(t, err)
		_, err = e.Reload(plan)
		must(t, err)
		// the subscriber reads while the new resource is listing
		must(t, f.Replace(name, obj))
		take(fmt.Sprint("after move ", i))
	}
}

func uniqueConfig(unique bool) *schema.Config {
	return &schema.Config{Resources: []schema.Resource{{Name: "apps", Version: "v1", Resource: "apps",
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name", Unique: unique}}}}}
}

// TestUniqueToggleWithWriteInWindow: the kept resource's writer goes
// on between the store's Reconfigure (unique toggled) and hub.reconfigure.
func TestUniqueToggleWithWriteInWindow(t *testing.T) {
	e := testEngine(t, uniqueConfig(true))
	for _, w := range watchersOf(e) {
		must(t, w.Replace(nil, ""))
	}
	f := &Feed{e: e}
	old := func(name string, created string, models ...string) []byte {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": name, "creationTimestamp": created}, "spec": map[string]any{"models": models}})
		return b
	}
	must(t, f.Apply("apps", old("a", "2020-01-01T00:00:00Z", "m1")))
	must(t, f.Apply("apps", old("b", "2021-01-01T00:00:00Z", "m1")))
	all, err := e.Subscribe(context.Background(), IndexOf("model-to-app"))
	must(t, err)
	defer all.Close()
	key, err := e.Subscribe(context.Background(), KeyOf("model-to-app", "m1"))
	must(t, err)
	defer key.Close()
	holds := map[string][]string{}
	var keyHolds []string
	take := func(what string) {
		for _, ev := range drainAll(t, all) {
			t.Logf("%s: index event %v %q %v", what, ev.Type, ev.Key, ev.Values)
			if ev.Type == EventUpdate && slices.Equal(holds[ev.Key], ev.Values) {
				t.Errorf("%s: no-op update %q %v", what, ev.Key, ev.Values)
			}
			if ev.Key != "" {
				holds[ev.Key] = ev.Values
			}
		}
		for _, ev := range drainAll(t, key) {
			t.Logf("%s: key event %v %v", what, ev.Type, ev.Values)
			if ev.Type == EventUpdate && slices.Equal(keyHolds, ev.Values) {
				t.Errorf("%s: no-op key update %v", what, ev.Values)
			}
			keyHolds = ev.Values
		}
		for _, k := range []string{"m1", "m2"} {
			if !slices.Equal(holds[k], e.Lookup("model-to-app", k)) {
				t.Fatalf("%s: index subscriber holds %s=%v, store %v", what, k, holds[k], e.Lookup("model-to-app", k))
			}
		}
		if !slices.Equal(keyHolds, e.Lookup("model-to-app", "m1")) {
			t.Fatalf("%s: key subscriber holds %v, store %v", what, keyHolds, e.Lookup("model-to-app", "m1"))
		}
	}
	take("initial")
	for i, u := range []bool{false, true, false} {
		testHookPublished = func() {
			must(t, f.Apply("apps", old("c", "2022-01-01T00:00:00Z", "m2", fmt.Sprint("x", i))))
		}
		plan, err := schema.Compile(uniqueConfig(u))
		must(t, err)
		_, err = e.Reload(plan)
		testHookPublished = nil
		must(t, err)
		take(fmt.Sprintf("unique=%v", u))
	}
}

// TestStressReloadsWrites: concurrent writes, reloads toggling
// unique, a Compact now and then; index and key subscribers that read all
// along, and resume from their version now and then. Afterwards each holds
// what the store answers; no update repeats a held answer; versions never
// go back.
func TestStressReloadsWrites(t *testing.T) {
	e := testEngine(t, uniqueConfig(true))
	for _, w := range watchersOf(e) {
		must(t, w.Replace(nil, ""))
	}
	f := &Feed{e: e}
	obj := func(name string, year int, models ...string) []byte {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": name, "creationTimestamp": fmt.Sprintf("%d-01-01T00:00:00Z", year)}, "spec": map[string]any{"models": models}})
		return b
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	var wg gosync.WaitGroup
	results := make(chan stressResult, 8)
	runIndex := func(id int) {
		defer wg.Done()
		followIndex(ctx, e, id, stop, results)
	}
	for i := range 2 {
		wg.Add(1)
		go runIndex(i)
	}
	r := rand.New(rand.NewPCG(3, 4))
	names := []string{"a", "b", "c", "d", "e"}
	models := []string{"m0", "m1", "m2", "m3"}
	unique := true
	for i := range 1500 {
		switch op := r.IntN(100); {
		case op < 3:
			unique = !unique
			plan, err := schema.Compile(uniqueConfig(unique))
			must(t, err)
			_, err = e.Reload(plan)
			must(t, err)
		case op < 5:
			e.Inspect().Compact()
		case op < 10:
			var objs [][]byte
			for _, n := range names {
				if r.IntN(3) > 0 {
					objs = append(objs, obj(n, 2000+r.IntN(3), models[r.IntN(4)], models[r.IntN(4)]))
				}
			}
			must(t, f.Replace("apps", objs...))
		case op < 20:
			must(t, f.Delete("apps", names[r.IntN(len(names))]))
		default:
			must(t, f.Apply("apps", obj(names[r.IntN(len(names))], 2000+r.IntN(3), models[r.IntN(4)], fmt.Sprint("k", i%50))))
		}
		if i%100 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	close(results)
	for res := range results {
		if res.err != "" {
			t.Fatal(res.err)
		}
		for _, k := range e.Keys("model-to-app") {
			if !slices.Equal(res.holds[k], e.Lookup("model-to-app", k)) {
				t.Fatalf("index subscriber holds %s=%v, store %v", k, res.holds[k], e.Lookup("model-to-app", k))
			}
		}
		for k, v := range res.holds {
			if !slices.Equal(v, e.Lookup("model-to-app", k)) {
				t.Fatalf("index subscriber holds %s=%v, store %v", k, v, e.Lookup("model-to-app", k))
			}
		}
	}
}

// stressResult is what a subscriber of TestStressReloadsWrites ends with:
// the answers it holds, or what it found wrong.
type stressResult struct {
	holds map[string][]string
	err   string
}

// followIndex follows model-to-app on e, one subscription at a time, until
// stop: it resumes from its last version every 37th event, and fails on a
// no-op update or a version that goes back. It sends what it holds, or
// the failure, to results.
func followIndex(ctx context.Context, e *Engine, id int, stop <-chan struct{}, results chan<- stressResult) {
	holds := map[string][]string{}
	tg := IndexOf("model-to-app")
	var last uint64
	sub, err := e.Subscribe(ctx, tg)
	if err != nil {
		results <- stressResult{err: err.Error()}
		return
	}
	n := 0
	var trail []string
	for {
		c, cc := context.WithTimeout(ctx, 300*time.Millisecond)
		ev, err := sub.Next(c)
		cc()
		if err != nil {
			select {
			case <-stop:
				sub.Close()
				results <- stressResult{holds: holds}
				return
			default:
				continue
			}
		}
		n++
		trail = append(trail, fmt.Sprintf("%v %q %v %s", ev.Type, ev.Key, ev.Values, ev.Version))
		if len(trail) > 12 {
			trail = trail[1:]
		}
		switch ev.Type {
		case EventReset:
			holds = map[string][]string{}
		case EventUpdate:
			if slices.Equal(holds[ev.Key], ev.Values) {
				results <- stressResult{err: fmt.Sprintf("index %d: no-op update %q %v\n%s", id, ev.Key, ev.Values, strings.Join(trail, "\n"))}
				return
			}
		}
		if ev.Key != "" {
			holds[ev.Key] = ev.Values
		}
		if ev.Version != "" && !strings.HasSuffix(ev.Version, ":partial") {
			seq, _, _ := e.parseVersion(ev.Version)
			if seq < last {
				results <- stressResult{err: fmt.Sprintf("index %d: version %d after %d", id, seq, last)}
				return
			}
			last = seq
			if n%37 == 0 && ev.Type != EventSnapshot {
				// resume from here
				sub.Close()
				tg.Resume = ev.Version
				trail = append(trail, "resume "+ev.Version)
				if sub, err = e.Subscribe(ctx, tg); err != nil {
					results <- stressResult{err: err.Error()}
					return
				}
			}
		}
	}
}
