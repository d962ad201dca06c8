package follow

import (
	"bytes"
	"log/slog"
	gosync "sync"
	"testing"
	"time"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
)

type logBuf struct {
	mu gosync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func outageWatcher(t *testing.T, lb *logBuf) *Watcher {
	store, err := indexer.New(indexer.SourceSpec{Name: "r"})
	if err != nil {
		t.Fatal(err)
	}
	w := NewWatcher(&compiled.Resource{Name: "r"}, "", slog.New(slog.NewTextHandler(lb, nil)))
	w.StaleAfter, w.DropAfter, w.Src = time.Hour, time.Hour, store.Source("r")
	return w
}

// TestCutOutlivesTheRun: a cut-off resource whose run ends (Halt, as a
// reload does before Inherit) stays stale, and the watcher that takes
// over inherits that.
func TestCutOutlivesTheRun(t *testing.T) {
	lb := &logBuf{}
	w := outageWatcher(t, lb)
	if err := w.Replace(nil, "1"); err != nil {
		t.Fatal(err)
	}
	w.Fail(errTest)
	w.cutOff(w.FailingSince)
	t.Logf("cut: Stale()=%v", w.Stale())
	w.ended() // Halt waits for Run, whose defer is ended
	t.Logf("after ended: Stale()=%v", w.Stale())
	n := NewWatcher(w.Plan, "", w.Log)
	n.Inherit(w)
	t.Logf("restarted watcher: Stale()=%v", n.Stale())
	if !w.Stale() || !n.Stale() {
		t.Errorf("a cut-off resource reads fresh once its run ended / after a reload: old %v, new %v", w.Stale(), n.Stale())
	}
}

// TestDroppedOutlivesTheRun: a dropped part whose run ended and was
// relaunched (after a reload that failed): the list that brings it back
// logs it.
func TestDroppedOutlivesTheRun(t *testing.T) {
	lb := &logBuf{}
	w := outageWatcher(t, lb)
	if err := w.Replace(nil, "1"); err != nil {
		t.Fatal(err)
	}
	w.Fail(errTest)
	w.dropPart(w.FailingSince)
	w.cutOff(w.FailingSince)
	w.ended()
	// relaunched: Run again (its list)
	if err := w.Replace(nil, "2"); err != nil {
		t.Fatal(err)
	}
	back := bytes.Contains([]byte(lb.String()), []byte("part is back"))
	t.Logf("after relaunch+list: Stale()=%v, 'part is back' logged=%v", w.Stale(), back)
	if !back {
		t.Errorf("the list after a relaunch does not log the part back")
	}
}

// TestListRacesFailure: a list that brings a dropped part back while a
// new failure begins: the outage that failure starts still goes stale
// after staleAfter (the list's move and the failure's are made under one
// lock).
func TestListRacesFailure(t *testing.T) {
	store, err := indexer.New(indexer.SourceSpec{Name: "r"})
	if err != nil {
		t.Fatal(err)
	}
	src := store.Source("r")
	lost := 0
	n := 20000
	if testing.Short() {
		n = 2000
	}
	for range n {
		w := NewWatcher(&compiled.Resource{Name: "r"}, "", slog.New(slog.DiscardHandler))
		w.StaleAfter, w.DropAfter, w.Src = time.Hour, time.Hour, src
		_ = w.Replace(nil, "1")
		w.Fail(errTest)
		w.dropPart(w.FailingSince)
		w.WatchEstablished() // Dropped, no error: the part waits for a list
		var start, done gosync.WaitGroup
		start.Add(1)
		done.Add(2)
		go func() { defer done.Done(); start.Wait(); _ = w.Replace(nil, "2") }()
		go func() { defer done.Done(); start.Wait(); w.Fail(testError("watch: connection reset")) }()
		start.Done()
		done.Wait()
		w.Mu.Lock()
		since := w.FailingSince
		w.Mu.Unlock()
		w.cutOff(since) // staleAfter passed in the new outage
		if !w.Stale() {
			lost++
			if lost == 1 {
				t.Logf("phase %v, lastErr %v: staleAfter passed, not stale", w.Phase(), w.LastError())
			}
		}
		w.ended()
	}
	t.Logf("%d of %d outages never went stale", lost, n)
	if lost > 0 {
		t.Fail()
	}
}

// TestRunAgainGoesStale: a watcher whose run ended and that runs again
// (relaunched after a reload that failed) arms its timers in the next
// outage, and goes stale after staleAfter.
func TestRunAgainGoesStale(t *testing.T) {
	w := outageWatcher(t, &logBuf{})
	if err := w.Replace(nil, "1"); err != nil {
		t.Fatal(err)
	}
	w.ended()
	w.begin() // Run again
	w.WatchEstablished()
	w.Fail(errTest)
	w.Mu.Lock()
	armed := w.cutTimer != nil
	w.Mu.Unlock()
	w.cutOff(w.FailingSince)
	if !armed || !w.Stale() {
		t.Errorf("a watcher run again: stale timer armed %v, stale after staleAfter %v", armed, w.Stale())
	}
	w.ended()
}
