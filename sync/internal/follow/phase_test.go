package follow

import (
	"log/slog"
	"testing"
	"time"

	"github.com/iidp/metasync/indexer"
)

// TestPhaseLadder walks an outage through the watcher's own transitions:
// a failure, staleAfter, dropAfter, the list that brings the part back and
// the watch that makes the answers current; stale follows the phase.
func TestPhaseLadder(t *testing.T) {
	store, err := indexer.New(indexer.SourceSpec{Name: "r"})
	if err != nil {
		t.Fatal(err)
	}
	w := &Watcher{Log: slog.New(slog.DiscardHandler), StaleAfter: time.Hour, DropAfter: time.Hour, Src: store.Source("r"), Synced: make(chan struct{}), totals: &totals{}}
	close(w.Synced)
	step := func(what string, do func(), want Phase) {
		t.Helper()
		do()
		if got := w.Phase(); got != want {
			t.Fatalf("after %s: phase %v, want %v", what, got, want)
		}
		if w.Phase().cut() != (want == PhaseCut || want == PhaseDroppedCut) {
			t.Fatalf("after %s: cut() wrong for %v", what, want)
		}
	}
	step("a failure", func() { w.Fail(errTest) }, PhaseFailing)
	since := w.FailingSince
	step("staleAfter", func() { w.cutOff(since) }, PhaseCut)
	step("staleAfter again", func() { w.cutOff(since) }, PhaseCut)
	step("a watch established", w.WatchEstablished, PhaseHealthy)
	step("a failure", func() { w.Fail(errTest) }, PhaseFailing)
	since = w.FailingSince
	step("dropAfter", func() { w.dropPart(since) }, PhaseDropped)
	step("staleAfter", func() { w.cutOff(since) }, PhaseDroppedCut)
	step("a watch established", w.WatchEstablished, PhaseDropped)
	step("the run over", w.ended, PhaseDropped)
	step("a failure after the run", func() { w.Fail(errTest) }, PhaseDropped)
	step("a timer after the run", func() { w.cutOff(w.FailingSince) }, PhaseDropped)
}

var errTest = testError("connection refused")

type testError string

func (e testError) Error() string { return string(e) }
