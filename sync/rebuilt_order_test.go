package sync

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/schema"
)

// TestRecoveredLetsAResumerResume: a warm-started resource resumes
// through an outage; a sibling's watch comes back first and wakes it: it
// goes on resuming, it does not list.
func TestRecoveredLetsAResumerResume(t *testing.T) {
	cfg := snapshotConfig()
	r2 := cfg.Resources[0]
	r2.Name, r2.Resource = "others", "others"
	r2.Indexes = []schema.Index{{Name: "other-ix", Key: "spec.models", Value: "metadata.name"}}
	cfg.Resources = append(cfg.Resources, r2)
	e := testEngine(t, cfg)
	ws := watchersOf(e)
	a, b := ws[0], ws[1]
	forW, _, err := clientsOf(&rest.Config{Host: "http://127.0.0.1:1"}) // nothing listens: an outage
	if err != nil {
		t.Fatal(err)
	}
	c, _ := forW(b)
	b.SetClient(c)
	b.ResumeRV = "5"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan bool, 1)
	go func() { done <- b.ResumeOrList(ctx) }()
	eventually(t, "b failing", func() bool { return b.LastError() != nil })
	a.Fail(context.DeadlineExceeded)
	a.WatchEstablished() // a is answered again: go e.recovered(a)
	select {
	case list := <-done:
		t.Errorf("resumeOrList returned %v: the resuming resource left resume (lists) because a sibling recovered", list)
		return
	case <-time.After(2 * time.Second):
		t.Log("still resuming")
	}
	cancel()
	<-done
}

// TestRereadsAnsweredOutOfOrder: two readings of the identity under way,
// answered out of order around a change: the later one wins, and the
// change is told once.
func TestRereadsAnsweredOutOfOrder(t *testing.T) {
	id := &follow.Identity{}
	var calls atomic.Int32
	release := make(chan struct{})
	id.Fetch = func(ctx context.Context, cached bool) (string, error) {
		switch calls.Add(1) {
		case 1:
			return "old", nil
		case 2:
			<-release // slow: read before the change
			return "old", nil
		default:
			return "new", nil
		}
	}
	id.Reread(context.Background(), 0) // known: old
	type res struct{ was, now string }
	slow := make(chan res, 1)
	go func() { w, n, _ := id.Reread(context.Background(), 0); slow <- res{w, n} }()
	time.Sleep(100 * time.Millisecond)
	w, n, _ := id.Reread(context.Background(), 0)
	t.Logf("fast: %s -> %s", w, n)
	close(release)
	r := <-slow
	t.Logf("slow: %s -> %s; id now %q", r.was, r.now, id.ID)
	if r.was != r.now {
		t.Errorf("a second, spurious change reported: %s -> %s; identity left at %q", r.was, r.now, id.ID)
	}
}

// TestSecondChangeDuringASettle: a change found while the settle of the
// one before is under way stays pending until its own look at the cache.
func TestSecondChangeDuringASettle(t *testing.T) {
	e := testEngine(t, clustersConfig("east", "west"))
	id := e.identOf("west")
	block := make(chan struct{})
	entered := make(chan struct{}, 1)
	var phase2 atomic.Bool
	id.Fetch = func(_ context.Context, cached bool) (string, error) {
		if phase2.Load() {
			if cached {
				return "uid1", nil // the cache still serves the old history
			}
			return "uid2", nil
		}
		if cached {
			entered <- struct{}{}
			<-block
		}
		return "uid1", nil
	}
	w := partOf(t, e, "west")
	listIn(t, w, "100", "w1")
	id.Pending.Store(true)
	go e.settleChange(context.Background(), "west") // the first change: cache == etcd (uid1)
	<-entered
	// Meanwhile a second change is found (resourceVersion went back); its
	// settle must look at the cache again.
	second := make(chan struct{})
	go func() { e.clusterChanged(context.Background(), "west", "second"); close(second) }()
	time.Sleep(100 * time.Millisecond)
	phase2.Store(true)
	close(block)
	<-second
	t.Logf("pending=%v", id.Changing())
	if !id.Changing() {
		t.Errorf("second change settled without its cache check: pending cleared by the first settle")
	}
}
