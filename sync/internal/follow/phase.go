package follow

import "slices"

// Phase is where a watcher stands in an outage of its apiserver, in one
// value: what the answers of its resource may be trusted with, and what
// brings them back. Every change of it is one of the transitions below
// (a compare and swap, so that two goroutines never both make one):
//
//	Healthy   --Fail-------------------> Failing
//	Failing   --staleAfter passed------> Cut         (cutOff)
//	Failing   --dropAfter passed-------> Dropped     (dropPart)
//	Cut       --dropAfter passed-------> DroppedCut  (dropPart)
//	Dropped   --staleAfter passed------> DroppedCut  (cutOff)
//	Failing   --a watch established----> Healthy
//	Cut       --a watch established----> Healthy     (answers current again)
//	DroppedCut--a watch established----> Dropped     (the part waits for a list)
//	Dropped   --a list that worked-----> Failing, or Healthy once a watch was established since the failure
//	DroppedCut--a list that worked-----> Cut
//
// A Failing resource answers as fresh, a Cut one as stale; a Dropped
// one's part has left the answers (the engine's other clusters answer),
// and DroppedCut is both. The phase outlives the run: a resource whose
// run ended while cut off stays stale, for a reload's watcher that takes
// over (Inherit) and for the snapshot written at the stop; once the run
// is over, no timer moves it.
type Phase uint32

// The phases of a watcher (see Phase).
const (
	PhaseHealthy Phase = iota
	PhaseFailing
	PhaseCut
	PhaseDropped
	PhaseDroppedCut
)

var phaseNames = [...]string{"healthy", "failing", "cut", "dropped", "dropped, cut"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "unknown"
}

// cut reports a phase whose answers read stale: cut off for staleAfter.
func (p Phase) cut() bool { return p == PhaseCut || p == PhaseDroppedCut }

// Dropped reports a phase whose cluster part left the answers.
func (p Phase) Dropped() bool { return p == PhaseDropped || p == PhaseDroppedCut }

// Phase returns the watcher's phase now.
func (w *Watcher) Phase() Phase { return Phase(w.phase.Load()) }

// move makes the transition of the pair whose from is the phase now, if
// any, and returns the phase it left and whether it moved.
func (w *Watcher) move(pairs ...[2]Phase) (Phase, bool) {
	for {
		now := w.Phase()
		i := slices.IndexFunc(pairs, func(p [2]Phase) bool { return p[0] == now })
		if i < 0 {
			return now, false
		}
		if w.phase.CompareAndSwap(uint32(now), uint32(pairs[i][1])) {
			return now, true
		}
	}
}
