package sync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"
)

// TestResumeToAnEmptyAnswer guards a resume whose answer became empty
// while the subscriber was away: the subscriber still holds the old
// answer, so it is sent the empty one, for a key and for a chain; a
// resume from that empty answer then sends nothing.
func TestResumeToAnEmptyAnswer(t *testing.T) {
	e, f := routingEngine(t)
	for _, c := range []struct {
		target Target
		remove func() error
	}{
		{KeyOf("model-to-app", "m1"), func() error { return f.Delete("apps", "a") }},
		{ChainOf("model-to-addresses", "m1"), func() error { return f.Delete("slices", "a-1") }},
	} {
		must(t, f.Apply("apps", appJSON("a", "m1")))
		must(t, f.Apply("slices", sliceJSON("a-1", "a", "10.0.0.5")))
		sub, err := e.Subscribe(context.Background(), c.target)
		must(t, err)
		first := next(t, sub)
		if first.Type != EventSnapshot || len(first.Values) != 1 {
			t.Fatalf("%+v: first event %+v", c.target, first)
		}
		sub.Close()

		must(t, c.remove())
		resume := c.target
		resume.Resume = first.Version
		sub, err = e.Subscribe(context.Background(), resume)
		must(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ev, err := sub.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%+v: resume from %v to an empty answer sent nothing (%v): the subscriber keeps %v", c.target, first.Values, err, first.Values)
		}
		if ev.Type != EventUpdate || ev.Key != "m1" || len(ev.Values) != 0 {
			t.Fatalf("%+v: resume sent %+v, want an empty update of m1", c.target, ev)
		}
		if !sub.HasSynced() || sub.Version() != ev.Version {
			t.Fatalf("%+v: after the update, synced %v at %q, want synced at %q", c.target, sub.HasSynced(), sub.Version(), ev.Version)
		}
		sub.Close()

		// The empty answer is a state to resume from like any other.
		resume.Resume = ev.Version
		sub, err = e.Subscribe(context.Background(), resume)
		must(t, err)
		noEvent(t, sub)
		if !sub.HasSynced() {
			t.Fatalf("%+v: a resume from the empty answer is not synced", c.target)
		}
		sub.Close()
	}
	openAfter(t, e, 0)
}

// TestSubscribeWithEndedContext guards Subscribe given a context that has
// ended already: the subscription is closed at once (Next says ErrClosed)
// and counted as closed, and nothing crashes.
func TestSubscribeWithEndedContext(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("apps", appJSON("a", "m1")))
	targets := []Target{KeyOf("model-to-app", "m1"), ChainOf("model-to-addresses", "m1"), IndexOf("model-to-app")}
	for i := range 2000 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		sub, err := e.Subscribe(ctx, targets[i%len(targets)])
		must(t, err)
		if i%100 == 0 {
			// Close runs in a goroutine of the context's: wait for it.
			done, stop := context.WithTimeout(context.Background(), 5*time.Second)
			for {
				if _, err := sub.Next(done); err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Fatalf("Next of a subscription whose context ended: %v, want ErrClosed", err)
					}
					break
				}
			}
			stop()
		}
	}
	openAfter(t, e, 0)
}

// registered counts the subscriptions that the hub still routes commits
// to: key and chain registrations, and index subscriptions.
func registered(e *Engine) int {
	e.hub.mu.Lock()
	defer e.hub.mu.Unlock()
	n := 0
	for _, is := range e.hub.indexes {
		for _, subs := range is.keys {
			n += len(subs)
		}
		n += len(is.all)
	}
	return n
}

// TestCloseRacingRegistration guards Close called while the first Next
// registers the subscription with the hub: once closed, a subscription is
// registered nowhere, whichever came first, so writes no longer reach it.
func TestCloseRacingRegistration(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("apps", appJSON("a", "m1")))
	must(t, f.Apply("slices", sliceJSON("a-1", "a", "10.0.0.5")))
	targets := []Target{KeyOf("model-to-app", "m1"), ChainOf("model-to-addresses", "m1"), IndexOf("model-to-app")}
	for i := range 2000 {
		sub, err := e.Subscribe(context.Background(), targets[i%len(targets)])
		must(t, err)
		var wg gosync.WaitGroup
		wg.Go(func() { _, _ = sub.Next(context.Background()) })
		sub.Close()
		wg.Wait()
	}
	openAfter(t, e, 0)
	if n := registered(e); n != 0 {
		t.Fatalf("%d registrations of closed subscriptions left in the hub", n)
	}
}

// TestIndexVersionResumesOnlyItsIndex guards the versions of an index
// subscription: one resumes the index it came from, but given to another
// index, or to a key subscription, it is a reset followed by the whole
// state, never a resume that would skip keys the subscriber never had.
func TestIndexVersionResumesOnlyItsIndex(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("slices", sliceJSON("s1", "app1", "10.0.0.1")))
	sub, err := e.Subscribe(context.Background(), IndexOf("model-to-app"))
	must(t, err)
	synced := next(t, sub) // the index is empty
	if synced.Type != EventSynced {
		t.Fatalf("first event %+v, want synced", synced)
	}
	sub.Close()

	// Its own index resumes: nothing changed, so it is synced at once.
	sub, err = e.Subscribe(context.Background(), Target{Index: "model-to-app", All: true, Resume: synced.Version})
	must(t, err)
	if ev := next(t, sub); ev.Type != EventSynced {
		t.Fatalf("resume of its own index: %+v, want synced", ev)
	}
	sub.Close()

	// Another index resets and sends what it holds.
	sub, err = e.Subscribe(context.Background(), Target{Index: "app-to-addresses", All: true, Resume: synced.Version})
	must(t, err)
	if ev := next(t, sub); ev.Type != EventReset {
		t.Fatalf("a version of model-to-app given to app-to-addresses: %+v, want a reset", ev)
	}
	if ev := next(t, sub); ev.Type != EventSnapshot || ev.Key != "app1" || !slices.Equal(ev.Values, []string{"10.0.0.1"}) {
		t.Fatalf("after the reset: %+v, want the snapshot of app1", ev)
	}
	if ev := next(t, sub); ev.Type != EventSynced {
		t.Fatalf("after the snapshot: %+v, want synced", ev)
	}
	sub.Close()

	// A key subscription resets too.
	sub, err = e.Subscribe(context.Background(), Target{Index: "app-to-addresses", Key: "app1", Resume: synced.Version})
	must(t, err)
	if ev := next(t, sub); ev.Type != EventReset {
		t.Fatalf("an index version given to a key: %+v, want a reset", ev)
	}
	if ev := next(t, sub); ev.Type != EventSnapshot || !slices.Equal(ev.Values, []string{"10.0.0.1"}) {
		t.Fatalf("after the reset: %+v, want the snapshot", ev)
	}
	sub.Close()
	openAfter(t, e, 0)
}

// TestPendingKeysBoundedByTheIndex guards an index subscriber that stops
// taking events while keys come and go: the keys it has still to look at
// stay bounded (pendingMax), not by the writes; when it takes events again it gets exactly what changed.
func TestPendingKeysBoundedByTheIndex(t *testing.T) {
	e, f := routingEngine(t)
	for i := range 5 {
		must(t, f.Apply("apps", appJSON(fmt.Sprintf("stay-%d", i), fmt.Sprintf("stay-%d", i))))
	}
	sub, err := e.Subscribe(context.Background(), IndexOf("model-to-app"))
	must(t, err)
	defer sub.Close()
	for {
		if ev := next(t, sub); ev.Type == EventSynced {
			break
		}
	}

	// The subscriber takes nothing while more keys than it keeps pending
	// come and go, and two of the keys it holds change.
	const churn = pendingMax + 500
	bound := pendingMax
	largest := 0
	for i := range churn {
		name := fmt.Sprintf("gone-%d", i)
		must(t, f.Apply("apps", appJSON(name, name)))
		must(t, f.Delete("apps", name))
		if i == churn/2 {
			must(t, f.Delete("apps", "stay-0"))
			must(t, f.Apply("apps", appJSON("stay-1", "stay-1", "new")))
		}
		sub.mu.Lock()
		largest = max(largest, len(sub.pending))
		sub.mu.Unlock()
	}
	if largest > bound {
		t.Fatalf("the pending keys of an idle index subscriber reached %d, over an index of %d keys (bound %d)", largest, len(e.Keys("model-to-app")), bound)
	}

	var got []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		ev, err := sub.Next(ctx)
		cancel()
		if err != nil {
			break
		}
		if ev.Type != EventUpdate {
			t.Fatalf("after the writes: %+v", ev)
		}
		got = append(got, ev.Key+"="+strings.Join(ev.Values, ","))
	}
	if want := []string{"new=stay-1", "stay-0="}; !slices.Equal(got, want) {
		t.Fatalf("after the writes the subscriber got %v, want %v", got, want)
	}
}

// TestConcurrentNextIsSerialized guards Next called from two goroutines at
// once, with Version and HasSynced read from a third, under writes: the
// calls take turns, and when the writes stop the subscription has sent
// the index as it is, and nothing more.
func TestConcurrentNextIsSerialized(t *testing.T) {
	e, f := routingEngine(t)
	sub, err := e.Subscribe(context.Background(), IndexOf("model-to-app"))
	must(t, err)
	defer sub.Close()
	writing := make(chan struct{})
	var wg gosync.WaitGroup
	var mu gosync.Mutex
	events := 0
	for range 2 {
		wg.Go(func() {
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				_, err := sub.Next(ctx)
				cancel()
				if err == nil {
					mu.Lock()
					events++
					mu.Unlock()
					continue
				}
				select {
				case <-writing:
					return // the writes are over, and nothing came
				default:
				}
			}
		})
	}
	wg.Go(func() {
		for {
			_, _ = sub.Version(), sub.HasSynced()
			select {
			case <-writing:
				return
			default:
				time.Sleep(10 * time.Microsecond)
			}
		}
	})
	for i := 0; i < 2000 && err == nil; i++ {
		err = f.Apply("apps", appJSON(fmt.Sprintf("a%d", i%50), fmt.Sprintf("m%d", i%97)))
	}
	close(writing)
	wg.Wait()
	must(t, err)
	if events == 0 {
		t.Fatal("no events")
	}
	noEvent(t, sub)
	// What it sent is the index now: it is caught up (it holds the
	// current values, and no snapshot of its own), and the next write
	// gives exactly the key it changed.
	sub.nextMu.Lock()
	sub.mu.Lock()
	caught := sub.base == nil && len(sub.pending) == 0 && !sub.overflow && len(sub.queue) == 0
	sub.mu.Unlock()
	sub.nextMu.Unlock()
	if !caught {
		t.Fatal("the subscription is not caught up after the writes")
	}
	must(t, f.Apply("apps", appJSON("a-last", "m-last")))
	if ev := next(t, sub); ev.Type != EventUpdate || ev.Key != "m-last" || !slices.Equal(ev.Values, []string{"a-last"}) {
		t.Fatalf("after the last write: %+v", ev)
	}
	noEvent(t, sub)
}
