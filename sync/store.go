package sync

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/iidp/metasync/indexer"
)

// --- cache.ReflectorStore: the reflector writes here ---

func (w *watcher) add(obj any) error {
	w.added.Add(1)
	return w.put(obj)
}

func (w *watcher) update(obj any) error {
	w.updated.Add(1)
	return w.put(obj)
}

func (w *watcher) put(obj any) error {
	o, ok := obj.(*object)
	if !ok {
		return fmt.Errorf("unexpected %T in the watch of %s", obj, w.plan.Name)
	}
	tx := w.src.Begin()
	tx.Put(o.ix)
	// Counted by what the source holds: an ADDED of a key held (a cluster
	// rebuilt behind its address) or a MODIFIED of one not held adds what
	// it adds.
	w.count.Add(int64(tx.Added()))
	tx.Commit()
	w.failing.note(o.ix.Key, o.failed)
	w.wentBack(o.rv)
	w.rv.Store(&o.rv)
	w.touch()
	w.log.Debug("applied", "object", o.ix.Key, "resourceVersion", o.rv)
	return nil
}

// bookmark records the resourceVersion of a bookmark: the source is as
// of it.
func (w *watcher) bookmark(rv string) {
	w.wentBack(rv)
	w.rv.Store(&rv)
	w.touch()
}

// touch records that the apiserver was heard from now.
func (w *watcher) touch() { w.contact.Store(time.Now().UnixNano()) }

// lastContact is when the apiserver was last heard from: a list, an
// event, a bookmark or an established watch; zero before.
func (w *watcher) lastContact() time.Time {
	if at := w.contact.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Time{}
}

// UpdateResourceVersion is bookmark, for the reflector
// (cache.ResourceVersionUpdater).
func (s sink) UpdateResourceVersion(rv string) { s.w.bookmark(rv) }

// resourceVersion returns the resourceVersion the source is as of, at
// least: every write before it is in the source.
func (w *watcher) resourceVersion() string {
	if p := w.rv.Load(); p != nil {
		return *p
	}
	return ""
}

func (w *watcher) delete(obj any) error {
	w.deleted.Add(1)
	var key string
	var rv *string
	switch o := obj.(type) {
	case *object:
		key, rv = o.ix.Key, &o.rv
	case cache.DeletedFinalStateUnknown:
		key = o.Key
	case *cache.DeletedFinalStateUnknown:
		key = o.Key
	default:
		return fmt.Errorf("unexpected %T deleted in the watch of %s", obj, w.plan.Name)
	}
	if !strings.HasPrefix(key, w.keyPrefix) {
		key = w.keyPrefix + key
	}
	tx := w.src.Begin()
	tx.Delete(key)
	w.count.Add(int64(tx.Added()))
	tx.Commit()
	w.failing.note(key, nil)
	w.touch()
	if rv != nil {
		w.wentBack(*rv)
		w.rv.Store(rv)
	}
	return nil
}

func (w *watcher) replace(list []any, rv string) error {
	objs := make([]indexer.Object, 0, len(list))
	var failed map[string][]ruleFailure
	for _, it := range list {
		o, ok := it.(*object)
		if !ok {
			return fmt.Errorf("unexpected %T in the list of %s", it, w.plan.Name)
		}
		objs = append(objs, o.ix)
		if len(o.failed) > 0 {
			if failed == nil {
				failed = map[string][]ruleFailure{}
			}
			failed[o.ix.Key] = o.failed
		}
	}
	start := time.Now()
	w.src.ReplaceWithin(w.keyPrefix, objs)
	w.count.Store(int64(len(objs)))
	w.reconnected.Store(false)
	w.troubled.Store(false) // a whole list is the cluster's state
	w.answered.Store(true)
	w.answeredAgain()
	if !w.identity.changing() && w.rebuilt.Swap(false) {
		w.log.Info("listed from scratch after the cluster changed behind its address: answers current again", "objects", len(objs))
		w.noteFresh()
	}
	if w.partDropped.Swap(false) {
		w.log.Info("the cluster's part is back in the answers", "objects", len(objs))
	}
	w.touch()
	w.failing.replace(failed)
	w.rv.Store(&rv)
	w.log.Debug("replaced", "objects", len(objs), "took", time.Since(start).String())
	w.relists.Add(1)
	w.syncedOnce.Do(func() {
		w.syncedAt.Store(time.Now().UnixNano())
		close(w.synced)
		msg := "resource synced"
		switch {
		case w.inherited:
			msg = "resource synced with its new definition"
		case w.warm():
			msg = "resource caught up by a list: the snapshot's resourceVersion could not be resumed; only the differences were applied"
		}
		w.log.Info(msg, "objects", len(objs), "resourceVersion", rv)
		w.noteFresh()
	})
	return nil
}

// isSynced reports whether the resource has data to answer with: its
// first complete list is done, or, for a restarted resource, was done by
// its previous definition's watcher, or it was restored from a snapshot.
func (w *watcher) isSynced() bool {
	if (w.inherited && !w.dropped.Load()) || w.warm() {
		return true
	}
	return w.listed1()
}

// warm reports a resource restored from a snapshot whose data is still
// there (not dropped as another cluster's).
func (w *watcher) warm() bool { return w.restored && !w.dropped.Load() }

// stale reports a resource whose answers may be behind the apiserver:
// from a snapshot it has not caught up with yet, or cut off from the
// apiserver (its watch failing for staleAfter, see cutOff).
func (w *watcher) stale() bool {
	return w.cut.Load() || w.changing() || w.staleSnapshot()
}

// changing reports a resource whose cluster changed behind its address
// and that has not listed from scratch since (see rebuilt.go): a reload
// that restarts it meanwhile does not make its answers fresh.
func (w *watcher) changing() bool { return w.rebuilt.Load() || w.identity.changing() }

// staleSnapshot reports a resource that answers from a snapshot and has
// not caught up with the apiserver yet.
func (w *watcher) staleSnapshot() bool {
	return (w.warm() || w.staleFrom && !w.dropped.Load()) && !w.listed1()
}

// unverified reports data from a snapshot that no list has replaced yet:
// restored, or carried over a reload from such data.
func (w *watcher) unverified() bool {
	if w.listed1() || w.dropped.Load() {
		return false
	}
	return w.restored || w.carried != nil && w.carried.unverified
}

// indexSynced reports whether one index of the resource answers from a
// complete list: this watcher's, or, for an index that the previous
// definition had too, that one's. An index that a restart added (or moved
// here from another resource) is empty until this watcher's first list.
func (w *watcher) indexSynced(index string) bool {
	return w.listed1() || w.kept[index] && !w.dropped.Load() || w.warm()
}

// listed1 reports whether this watcher's first complete list is done, or,
// for a restored resource, its watch has caught up (see resume).
func (w *watcher) listed1() bool {
	select {
	case <-w.synced:
		return true
	default:
		return false
	}
}

// sink's methods are the watcher's (see sink).

func (s sink) Add(obj any) error                   { return s.w.add(obj) }
func (s sink) Update(obj any) error                { return s.w.update(obj) }
func (s sink) Delete(obj any) error                { return s.w.delete(obj) }
func (s sink) Replace(list []any, rv string) error { return s.w.replace(list, rv) }
func (s sink) Resync() error                       { return nil }
