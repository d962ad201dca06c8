package follow

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/iidp/metasync/indexer"
)

// --- cache.ReflectorStore: the reflector writes here ---

func (w *Watcher) Add(obj any) error {
	w.Added.Add(1)
	return w.put(obj)
}

func (w *Watcher) Update(obj any) error {
	w.updated.Add(1)
	return w.put(obj)
}

func (w *Watcher) put(obj any) error {
	o, ok := obj.(*Projected)
	if !ok {
		return fmt.Errorf("unexpected %T in the watch of %s", obj, w.Plan.Name)
	}
	tx := w.Src.Begin()
	tx.Put(o.Ix)
	// Counted by what the source holds: an ADDED of a key held (a cluster
	// rebuilt behind its address) or a MODIFIED of one not held adds what
	// it adds.
	w.Count.Add(int64(tx.Added()))
	tx.Commit()
	w.Failing.Note(o.Ix.Key, o.Failed)
	w.wentBack(o.RV)
	w.RV.Store(&o.RV)
	w.touch()
	w.Log.Debug("applied", "object", o.Ix.Key, "resourceVersion", o.RV)
	return nil
}

// bookmark records the resourceVersion of a bookmark: the source is as
// of it.
func (w *Watcher) bookmark(rv string) {
	w.wentBack(rv)
	w.RV.Store(&rv)
	w.touch()
}

// touch records that the apiserver was heard from now.
func (w *Watcher) touch() { w.contact.Store(time.Now().UnixNano()) }

// LastContact is when the apiserver was last heard from: a list, an
// event, a bookmark or an established watch; zero before.
func (w *Watcher) LastContact() time.Time {
	if at := w.contact.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Time{}
}

// UpdateResourceVersion is bookmark, for the reflector
// (cache.ResourceVersionUpdater).
func (s sink) UpdateResourceVersion(rv string) { s.w.bookmark(rv) }

func (w *Watcher) Delete(obj any) error {
	w.Deleted.Add(1)
	var key string
	var rv *string
	switch o := obj.(type) {
	case *Projected:
		key, rv = o.Ix.Key, &o.RV
	case cache.DeletedFinalStateUnknown:
		key = o.Key
	case *cache.DeletedFinalStateUnknown:
		key = o.Key
	default:
		return fmt.Errorf("unexpected %T deleted in the watch of %s", obj, w.Plan.Name)
	}
	if !strings.HasPrefix(key, w.KeyPrefix) {
		key = w.KeyPrefix + key
	}
	tx := w.Src.Begin()
	tx.Delete(key)
	w.Count.Add(int64(tx.Added()))
	tx.Commit()
	w.Failing.Note(key, nil)
	w.touch()
	if rv != nil {
		w.wentBack(*rv)
		w.RV.Store(rv)
	}
	return nil
}

func (w *Watcher) Replace(list []any, rv string) error {
	objs := make([]indexer.Object, 0, len(list))
	var failed map[string][]Failure
	for _, it := range list {
		o, ok := it.(*Projected)
		if !ok {
			return fmt.Errorf("unexpected %T in the list of %s", it, w.Plan.Name)
		}
		objs = append(objs, o.Ix)
		if len(o.Failed) > 0 {
			if failed == nil {
				failed = map[string][]Failure{}
			}
			failed[o.Ix.Key] = o.Failed
		}
	}
	start := time.Now()
	w.Src.ReplaceWithin(w.KeyPrefix, objs)
	w.Count.Store(int64(len(objs)))
	w.Reconnected.Store(false)
	w.troubled.Store(false) // a whole list is the cluster's state
	w.Answered.Store(true)
	w.answeredAgain()
	if !w.Identity.Changing() && w.Rebuilt.Swap(false) {
		w.Log.Info("listed from scratch after the cluster changed behind its address: answers current again", "objects", len(objs))
		w.NoteFresh()
	}
	if w.Phase().Dropped() {
		w.Mu.Lock()          // held over the move: Fail moves under it too
		back := PhaseHealthy // a watch was established since the failure
		if w.lastErr != nil {
			back = PhaseFailing
		}
		_, moved := w.move([2]Phase{PhaseDropped, back}, [2]Phase{PhaseDroppedCut, PhaseCut})
		w.Mu.Unlock()
		if moved {
			w.Log.Info("the cluster's part is back in the answers", "objects", len(objs))
		}
	}
	w.touch()
	w.Failing.Replace(failed)
	w.RV.Store(&rv)
	w.Log.Debug("replaced", "objects", len(objs), "took", time.Since(start).String())
	w.relists.Add(1)
	w.syncedOnce.Do(func() {
		w.syncedAt.Store(time.Now().UnixNano())
		close(w.Synced)
		msg := "resource synced"
		switch {
		case w.inherited:
			msg = "resource synced with its new definition"
		case w.Warm():
			msg = "resource caught up by a list: the snapshot's resourceVersion could not be resumed; only the differences were applied"
		}
		w.Log.Info(msg, "objects", len(objs), "resourceVersion", rv)
		w.NoteFresh()
	})
	return nil
}

// IsSynced reports whether the resource has data to answer with: its
// first complete list is done, or, for a restarted resource, was done by
// its previous definition's watcher, or it was restored from a snapshot.
func (w *Watcher) IsSynced() bool {
	if (w.inherited && !w.SnapshotDropped.Load()) || w.Warm() {
		return true
	}
	return w.Listed1()
}

// Warm reports a resource restored from a snapshot whose data is still
// there (not dropped as another cluster's).
func (w *Watcher) Warm() bool { return w.Restored && !w.SnapshotDropped.Load() }

// Stale reports a resource whose answers may be behind the apiserver:
// from a snapshot it has not caught up with yet, or cut off from the
// apiserver (its watch failing for staleAfter, see cutOff).
func (w *Watcher) Stale() bool {
	return w.Phase().cut() || w.Changing() || w.staleSnapshot()
}

// Changing reports a resource whose cluster changed behind its address
// and that has not listed from scratch since (see sync/rebuilt.go): a reload
// that restarts it meanwhile does not make its answers fresh.
func (w *Watcher) Changing() bool { return w.Rebuilt.Load() || w.Identity.Changing() }

// staleSnapshot reports a resource that answers from a snapshot and has
// not caught up with the apiserver yet.
func (w *Watcher) staleSnapshot() bool {
	return (w.Warm() || w.staleFrom && !w.SnapshotDropped.Load()) && !w.Listed1()
}

// Unverified reports data from a snapshot that no list has replaced yet:
// restored, or carried over a reload from such data.
func (w *Watcher) Unverified() bool {
	if w.Listed1() || w.SnapshotDropped.Load() {
		return false
	}
	return w.Restored || w.Carried != nil && w.Carried.Unverified
}

// IndexSynced reports whether one index of the resource answers from a
// complete list: this watcher's, or, for an index that the previous
// definition had too, that one's. An index that a restart added (or moved
// here from another resource) is empty until this watcher's first list.
func (w *Watcher) IndexSynced(index string) bool {
	return w.Listed1() || w.kept[index] && !w.SnapshotDropped.Load() || w.Warm()
}

// Listed1 reports whether this watcher's first complete list is done, or,
// for a restored resource, its watch has caught up (see resume).
func (w *Watcher) Listed1() bool {
	select {
	case <-w.Synced:
		return true
	default:
		return false
	}
}

// sink's methods are the watcher's (see sink).

func (s sink) Add(obj any) error                   { return s.w.Add(obj) }
func (s sink) Update(obj any) error                { return s.w.Update(obj) }
func (s sink) Delete(obj any) error                { return s.w.Delete(obj) }
func (s sink) Replace(list []any, rv string) error { return s.w.Replace(list, rv) }
func (s sink) Resync() error                       { return nil }
