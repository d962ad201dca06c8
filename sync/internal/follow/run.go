package follow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	compiled "github.com/iidp/metasync/internal/plan"

	"github.com/go-logr/logr"
	"github.com/iidp/metasync/indexer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Inherit takes over the counts and the synced state of the halted
// watcher of the resource's previous definition, so that its metrics go on
// counting and its indexes, which keep that one's answers until the first
// list, do not read as "not known yet". Until then, warm-start files keep what
// they answer (see carried).
func (w *Watcher) Inherit(old *Watcher) {
	w.Count.Store(old.Count.Load())
	// An apiserver that refused to stream this resource's list refuses
	// again: a reload that restarts the watch does not ask it again
	// (another namespace may be another answer: RBAC).
	if old.refused.Load() && old.Plan.GVR == w.Plan.GVR && old.Plan.Namespace == w.Plan.Namespace {
		w.refused.Store(true)
		w.Streaming.Store(false)
	}
	w.inherited = old.IsSynced()
	w.staleFrom, w.RestoredAt = old.Stale(), old.RestoredAt
	if rv := old.ResourceVersion(); w.inherited && rv != "" {
		c := &carried{def: old.Plan, RV: rv, Relist: old.RestoredRelist && !old.Listed1(), Unverified: old.Warm() && !old.Listed1()}
		if oc := old.Carried; oc != nil && !old.Listed1() {
			c = &carried{def: oc.def, RV: oc.RV, Relist: oc.Relist, Unverified: oc.Unverified}
		}
		c.Relist = c.Relist || !compiled.SameData(c.def, w.Plan)
		w.Carried = c
		w.RV.Store(&c.RV)
	}
	w.syncedAt.Store(old.syncedAt.Load())
	w.kept = map[string]bool{}
	for _, ix := range w.Plan.Indexes {
		if old.IndexSynced(ix.Name) && slices.ContainsFunc(old.Plan.Indexes, func(was compiled.Index) bool { return was.Name == ix.Name }) {
			w.kept[ix.Name] = true
		}
	}
	// An index answers through its fallback and hints: it is kept only
	// when they are (one that a reload added is empty until the list).
	for _, ix := range w.Plan.Indexes {
		for _, c := range []string{ix.Fallback, ix.Hints} {
			if c != "" && !w.kept[c] {
				delete(w.kept, ix.Name)
			}
		}
	}
	w.totals = old.totals
	for i, ix := range w.Plan.Indexes {
		for j, was := range old.Plan.Indexes {
			if was.Name == ix.Name {
				w.ruleErrors[i].Store(old.ruleErrors[j].Load())
			}
		}
	}
	w.Failing.keep(&old.Failing, func(index string) bool { return w.kept[index] })
}

// Rotate makes c the watcher's client and lists again through it at
// once; nothing leaves the answers meanwhile.
func (w *Watcher) Rotate(c rest.Interface) {
	w.Reconnected.Store(true)
	w.SetClient(c)
	// The new connection may reach another cluster (a kubeconfig
	// rewritten to point elsewhere), whose resourceVersions mean nothing
	// here: list again through it, which replaces this cluster's part in
	// place (no answer empties), rather than resume the watch.
	w.rotating.Store(true)
	w.listFresh.Store(true)
	if t := w.watching.Load(); t != nil {
		t.rotated.Store(true)
	}
	if f := w.RelistNow.Load(); f != nil {
		(*f)()
	}
}

// objects returns the number of the watcher's objects in snap.
func (w *Watcher) objects(snap *indexer.Snapshot) int {
	if w.ClusterName == "" {
		return snap.ObjectCount(w.Src)
	}
	return int(max(w.Count.Load(), 0))
}

// Run keeps the resource listed and watched until ctx ends. A resync period
// relists the resource that often.
//
// A run (one list, then watches) that ends for any other reason than a
// resync or ctx is a failure, even when the reflector returns nil, as it
// does for a watch that ends with an ERROR event or at once: the next run
// waits for the backoff. A 410 Gone (compaction) is relisted at once, but
// only as the first failure since the backoff was reset.
func (w *Watcher) Run(ctx context.Context) {
	w.begin()
	defer w.ended()
	w.runCtx.Store(&ctx)
	logger := logr.FromSlogHandler(w.Log.Handler())
	r := cache.NewReflectorWithOptions(lister{w}, &Projected{}, sink{w}, cache.ReflectorOptions{
		Name:            w.Plan.Name,
		TypeDescription: w.Plan.GVR.String(),
		Logger:          &logger,
	})
	if w.ResumeRV != "" && !w.ResumeOrList(ctx) {
		return
	}
	if w.ResumeRV == "" && w.Unverified() && w.Cluster != nil {
		// Data of a snapshot that this watcher lists, not resumes (carried
		// over a reload, or to be listed): the cluster check still decides
		// whether it is dropped at once, and what later warm-start files record.
		// Best effort: the list replaces it anyway.
		checkCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, _ = w.Cluster(checkCtx)
		cancel()
	}
	if w.Identity != nil {
		// The identity that a check after trouble compares with.
		idCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, _, _ = w.Identity.Reread(idCtx, rereadEvery)
		cancel()
	}
	delay := newBackoff()
	streak := 0 // failed runs since the backoff was reset
	for ctx.Err() == nil {
		runCtx, cancel := context.WithCancel(ctx)
		var resynced atomic.Bool
		relist := func() { resynced.Store(true); cancel() }
		w.RelistNow.Store(&relist)
		var timer gosync.WaitGroup
		if w.Plan.Resync > 0 {
			timer.Go(func() {
				w.resyncAfter(runCtx, func() {
					resynced.Store(true)
					cancel()
				})
			})
		}
		w.established.Store(0)
		failures := w.failures.Load()
		err := r.ListAndWatchWithContext(runCtx)
		cancel()
		timer.Wait()
		if ctx.Err() != nil {
			return // a stop is not trouble
		}
		if at := w.established.Load(); at != 0 && time.Since(time.Unix(0, at)) >= backoffResetAfter {
			delay, streak = newBackoff(), 0
		}
		if resynced.Load() || w.rotating.Swap(false) {
			continue // a resync, or a new connection taken: list again
		}
		// List and watch errors are recorded where they happen, without the
		// reflector's wrapping; record the others.
		if w.failures.Load() == failures {
			if err == nil {
				err = errors.New("watch ended")
			}
			w.Fail(err)
		}
		streak++
		if streak == 1 && isExpired(w.LastError()) {
			continue // compaction: list again at once, once
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay.Step()):
		case <-w.Wake: // another resource of the cluster is answered again
		}
	}
}

// begin lets the timers of the outages to come act again: a watcher
// that runs again (relaunched after a reload that failed) goes stale and
// drops its part as one that runs for the first time.
func (w *Watcher) begin() {
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.over = false
}

// ended stops the stale timer once run has returned: a watch that
// failed as the engine stopped marks nothing after.
func (w *Watcher) ended() {
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.over = true // the phase stays: a cut-off resource stays stale, a dropped part dropped
	if w.cutTimer != nil {
		w.cutTimer.Stop()
	}
	if w.dropTimer != nil {
		w.dropTimer.Stop()
	}
}

// LastError returns the last error since a watch was last established.
func (w *Watcher) LastError() error {
	w.Mu.Lock()
	defer w.Mu.Unlock()
	return w.lastErr
}

// resyncAfter calls resync once a resync period has passed after a
// complete list, to end the current list-and-watch so that run lists
// again. A list that takes longer than the period is never cut short.
func (w *Watcher) resyncAfter(ctx context.Context, resync func()) {
	listed := w.relists.Load()
	t := time.NewTimer(w.Plan.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if now := w.relists.Load(); now > listed {
			resync()
			return
		}
		t.Reset(w.Plan.Resync)
	}
}

// Status reports the watcher's state. A resource is ready once it has
// synced, for as long as it has not gone staleAfter without an established
// watch since its first error: a list that works while the watch keeps
// failing does not make it fresh.
func (w *Watcher) Status(snap *indexer.Snapshot, staleAfter time.Duration) Status {
	st := Status{
		Name:           w.Plan.Name,
		Cluster:        w.ClusterName,
		Optional:       !w.Required,
		GVR:            w.Plan.GVR.String(),
		Namespace:      w.Plan.Namespace,
		Objects:        w.objects(snap),
		Added:          w.Added.Load(),
		Updated:        w.updated.Load(),
		Deleted:        w.Deleted.Load(),
		Relists:        w.relists.Load(),
		ListErrors:     w.listErrors.Load(),
		WatchErrors:    w.watchErrors.Load(),
		Watches:        w.watches.Load(),
		Listed:         w.listed.Load(),
		Lists:          w.lists.Load(),
		ListSeconds:    time.Duration(w.listNanos.Load()).Seconds(),
		WatchesEnded:   w.watchesEnded.Load(),
		WatchSeconds:   time.Duration(w.watchNanos.Load()).Seconds(),
		ClusterChanges: w.ClusterChanges.Load(),
		RuleErrors:     map[string]int64{},
	}
	if w.IsSynced() {
		st.Synced = true
		if at := w.syncedAt.Load(); at != 0 {
			st.SyncedAt = time.Unix(0, at)
		}
	}
	st.Stale = w.Stale()
	snapshot := w.staleSnapshot()
	for i, ix := range w.Plan.Indexes {
		st.RuleErrors[ix.Public()] += w.ruleErrors[i].Load()
	}
	if n, last := w.Failing.Counts(); len(n) > 0 {
		st.Failing, st.LastRuleError = n, last
	}
	w.Mu.Lock()
	if w.lastErr != nil {
		st.Error = w.lastErr.Error()
		st.ErrorSince = w.FailingSince
	}
	w.Mu.Unlock()
	// A resource that a reload started is syncing until its first list,
	// for as long as that can still come: not once its resource is not
	// served, nor once it has failed for staleAfter.
	failingLong := st.Error != "" && time.Since(st.ErrorSince) >= staleAfter
	st.Syncing = w.Reloaded && !w.Listed1() && !(w.gone.Load() && st.Error != "") && !failingLong
	switch {
	case w.gone.Load() && st.Error != "":
		st.Reason = "not served: " + st.Error
	case snapshot && st.Error != "":
		st.Reason = "stale: answering from a snapshot, the apiserver not caught up with: " + st.Error
	case snapshot:
		st.Reason = "stale: answering from a snapshot while its watch resumes"
	case st.Syncing && !st.Synced && st.Error != "":
		st.Reason = "syncing, added by a reload: " + st.Error
	case st.Syncing && !st.Synced:
		st.Reason = "syncing, added by a reload: first list in progress"
	case !st.Synced && st.Error != "":
		st.Reason = "not synced: " + st.Error
	case !st.Synced:
		st.Reason = "not synced: first list in progress"
	case w.Changing():
		st.Reason = "stale: the cluster behind the address changed (rebuilt, or its etcd restored): listing from scratch"
	case failingLong:
		st.Reason = fmt.Sprintf("watch failing for %s, no established watch (answers keep what it last knew, marked stale): %s", time.Since(st.ErrorSince).Round(time.Second), st.Error)
	default:
		st.Ready = true
	}
	return st
}

// Halt stops w's run and waits for it to exit: after halt, w writes
// nothing; under e.mu.
func (w *Watcher) Halt() {
	if w.Cancel != nil {
		w.Cancel()
		<-w.Done
	}
}

// PublicFailures returns failures of w's set (a copy the caller owns, as
// counts returns) as the engine gives them: each object's key without
// w's cluster prefix, w's cluster beside it.
func (w *Watcher) PublicFailures(last map[string]RuleFailure) map[string]RuleFailure {
	if w.KeyPrefix == "" {
		return last
	}
	for index, rf := range last {
		rf.Object, rf.Cluster = strings.TrimPrefix(rf.Object, w.KeyPrefix), w.ClusterName
		last[index] = rf
	}
	return last
}
