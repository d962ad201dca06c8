package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
)

// watcher runs the watch of one resource entry and feeds its source in the
// indexer. It is the reflector's store: the reflector hands it projected
// objects, never raw ones.
type watcher struct {
	plan *compiled.Resource
	log  *slog.Logger
	// client is the REST client of the resource in its cluster; a new
	// kubeconfig replaces it while the watcher runs (see rotate).
	client atomic.Pointer[restClient]
	// watching is the watch open now, if any: rotate ends it so that the
	// next one goes through the new client.
	watching atomic.Pointer[trackedWatch]
	// rotating: rotate ended the watch, and no watch started since: a
	// reflector that returns then (a watch under a second old ends so)
	// lists again at once, without a failure.
	rotating atomic.Bool
	// listFresh: the next list asks for the current state, whatever
	// resourceVersion the reflector last saw (one of another cluster's,
	// after a rotation, may be far ahead of this one's).
	listFresh atomic.Bool
	// reconnected: rotate gave the watcher a new connection, and no list
	// through it has completed since: its data may be another cluster's,
	// which a snapshot marks to be listed, not resumed.
	reconnected atomic.Bool
	src         *indexer.Source // set when the engine publishes the watcher
	// cluster checks the cluster against the snapshot's (see
	// Engine.checkCluster); set with client.
	cluster func(context.Context) (clusterVerdict, error)
	// clusterName is the cluster the watcher reads, of a plan that
	// reads several ("" otherwise); keyPrefix, "NAME:" then, begins the
	// key of each of its objects in the source, which the watchers of
	// the resource's other clusters share; required: the resource is
	// synced only once this watcher is (the cluster's required). Set
	// before the watcher is used.
	clusterName, keyPrefix string
	required               bool
	// count is the number of the watcher's objects, kept where the
	// source holds other watchers' objects too (clusterName != "").
	count atomic.Int64
	// contact: unix nanos when the apiserver was last heard from (see
	// lastContact).
	contact atomic.Int64
	// reportSkipped: the Feed (NewOffline) reads which rules skipped an
	// object (object.skipped); set before the watcher is used.
	reportSkipped atomic.Bool

	// Set by Engine.launch, under the engine's mu: cancel stops run, done
	// is closed when it has returned.
	cancel context.CancelFunc
	done   chan struct{}
	// reloaded: a reload started this watcher (ResourceStatus.Syncing
	// until its first list); inherited: it restarts a resource whose
	// previous watcher had synced, so that the indexes the two share
	// (kept) hold that one's answers until the first list. Set before
	// the watcher is published.
	reloaded, inherited bool
	kept                map[string]bool

	// restored: the resource's objects came from a snapshot (see
	// warmstart.go), and resumeRV is the resourceVersion its watch resumes
	// from ("" when the snapshot's data must be listed: restoredRelist).
	// Set before Start. Until the watch has caught up (synced is closed),
	// the resource is stale. dropped: the snapshot turned out to be of
	// another cluster, and its data was cleared (see Engine.checkCluster).
	restored, restoredRelist bool
	resumeRV                 string
	dropped                  atomic.Bool
	// carried: the source holds what a previous definition of the resource entry
	// answered, and this watcher has not listed yet (see inherit); nil
	// otherwise. Snapshots write it until the first list.
	carried *carried
	// restoredAt is when the snapshot the data came from was written;
	// staleFrom: a reload restarted a resource that was stale, whose data
	// this one answers with until its first list.
	restoredAt time.Time
	staleFrom  bool
	// loaded is closed once a restored source can be written (see
	// indexer.Source.Load); nil when not restored.
	loaded <-chan struct{}
	// rv is the resourceVersion of the last write to the source (an
	// event's, a list's or a bookmark's), stored after the write: what a
	// snapshot of the source resumes from.
	rv atomic.Pointer[string]

	synced     chan struct{} // closed after the first complete list
	syncedOnce gosync.Once
	syncedAt   atomic.Int64 // unix nanos of the first sync

	mu      gosync.Mutex
	lastErr error // the last list or watch error since a watch was last established
	// failingSince is the time of the first error since a watch was last
	// established: a successful list does not reset it, an established
	// watch does.
	failingSince time.Time
	// cut: the watch has failed for staleAfter since failingSince, and
	// none was established since: the answers keep what the resource last
	// knew, marked stale, until a watch is established again (after the
	// list that brings its data up to date). cutTimer sets it.
	cut      atomic.Bool
	cutTimer *time.Timer
	// dropAfter, for a cluster's watcher, is how long its watch may fail
	// before its part leaves the answers (the cluster's dropAfter; 0:
	// never); dropTimer does it, and partDropped says it is done: the
	// part comes back with the next list.
	dropAfter   time.Duration
	dropTimer   *time.Timer
	partDropped atomic.Bool
	// relistNow ends the current run to list again at once (as a resync).
	relistNow atomic.Pointer[func()]
	// troubled: a list or watch failed, or a watch ended before its
	// timeout, since the cluster was last checked; the next watch checks
	// it first (see rebuilt.go). rebuilt: the cluster changed behind its
	// address, and the list from scratch is not done yet (stale until
	// then). identity is the cluster's (nil for an engine without one);
	// changed relists every resource of the cluster from scratch;
	// recovered wakes the cluster's other resources (wake) once this one
	// is answered again. Set before the watcher is used.
	troubled, rebuilt atomic.Bool
	// listing: a list is under way (recovered leaves it be); kicked: the
	// watcher woke the cluster's others in this outage (see
	// answeredAgain); runCtx is its run's context, which requests made
	// on its behalf end with.
	listing, kicked atomic.Bool
	runCtx          atomic.Pointer[context.Context]
	// answered: the last request to the apiserver worked (a list, or a
	// watch established); fail clears it. Clusters reports a cluster
	// connected by it, where Error keeps the trouble until a watch is
	// established.
	answered  atomic.Bool
	identity  *identity
	changed   func(ctx context.Context, why string)
	recovered func()
	wake      chan struct{}
	// over: run has returned; no timer marks the resource stale after.
	over       bool
	staleAfter time.Duration
	listed     atomic.Int64 // objects decoded by the current list

	established atomic.Int64 // unix nanos: the first watch established in the current run, 0 if none yet
	streaming   atomic.Bool  // lists are streamed (Options.StreamingList, see listByWatch) until the apiserver refuses one
	refused     atomic.Bool  // the apiserver refused a streaming list: the watcher that replaces this one at a reload lists too
	gone        atomic.Bool  // the apiserver answers 404: the resource is not served (CRD deleted?)

	*totals                   // the resource's, shared with the watchers it restarts
	ruleErrors []atomic.Int64 // per index of the resource
	ruleLog    rate.Sometimes
	// failing: the objects whose rule fails now, per index.
	failing failingSet
	// freshened, if set, is called when the resource may no longer be
	// stale: its first list or catch-up, a snapshot dropped.
	freshened func()
}

// totals are what a resource has done since the engine started: a
// watcher that restarts the resource (a reload) takes its predecessor's,
// halted by then, and goes on counting in them.
type totals struct {
	failures atomic.Int64 // errors recorded by fail
	watches  atomic.Int64 // watch requests that started

	added, updated, deleted, relists, listErrors, watchErrors atomic.Int64
	// clusterChanges: lists from scratch because the cluster behind the
	// address changed (see rebuilt.go).
	clusterChanges atomic.Int64
	// Requests that ended, and how long they took, in nanoseconds: lists
	// (all pages of one) and watches (from their start to their end).
	lists, listNanos, watchesEnded, watchNanos atomic.Int64
}

// noteFresh calls freshened, if set.
func (w *watcher) noteFresh() {
	if w.freshened != nil {
		w.freshened()
	}
}

// The reflector's two ends are two types: lister lists and watches the
// apiserver (listwatch.go), sink takes what the reflector read into the
// source (store.go); the watcher behind both keeps their shared state.
type (
	lister struct{ w *watcher }
	sink   struct{ w *watcher }
)

// The contracts of client-go that they fulfil for the reflector, the
// optional ones too: a reflector that finds a method missing does
// otherwise, silently (streams its lists, forgets bookmarks).
var (
	_ cache.ListerWatcherWithContext                      = lister{}
	_ interface{ IsWatchListSemanticsUnSupported() bool } = lister{}
	_ cache.ReflectorStore                                = sink{}
	_ cache.ResourceVersionUpdater                        = sink{}
)

func newWatcher(plan *compiled.Resource, cluster string, log *slog.Logger) *watcher {
	log = log.With("resource", plan.Name)
	prefix := ""
	if cluster != "" {
		log, prefix = log.With("cluster", cluster), cluster+":"
	}
	return &watcher{
		plan:        plan,
		clusterName: cluster,
		keyPrefix:   prefix,
		required:    true,
		log:         log,
		synced:      make(chan struct{}),
		wake:        make(chan struct{}, 1),
		totals:      &totals{},
		ruleErrors:  make([]atomic.Int64, len(plan.Indexes)),
		ruleLog:     rate.Sometimes{First: 5, Interval: 30 * time.Second},
	}
}

// carried is the data a restarted resource holds from an earlier
// definition of its entry until its first list: def is the definition its
// objects were projected by, rv the resourceVersion they are as of, and
// relist whether a snapshot of it must be listed rather than resumed
// (def's data is not the current definition's, or it came so from a
// snapshot). The store keeps the indexes of the same name and lays the
// objects' entries out for the current definition.
//
// unverified: the data descends from a snapshot that no list has
// replaced since, and whose cluster may not have been checked: it is
// dropped with the snapshot's when that turns out to be another
// cluster's, and snapshotted to be listed, not resumed, unless the check
// found this cluster.
type carried struct {
	def                *compiled.Resource
	rv                 string
	relist, unverified bool
}

// inherit takes over the counts and the synced state of the halted
// watcher of the resource's previous definition, so that its metrics go on
// counting and its indexes, which keep that one's answers until the first
// list, do not read as "not known yet". Until then, warm-start files keep what
// they answer (see carried).
func (w *watcher) inherit(old *watcher) {
	w.count.Store(old.count.Load())
	// An apiserver that refused to stream this resource's list refuses
	// again: a reload that restarts the watch does not ask it again
	// (another namespace may be another answer: RBAC).
	if old.refused.Load() && old.plan.GVR == w.plan.GVR && old.plan.Namespace == w.plan.Namespace {
		w.refused.Store(true)
		w.streaming.Store(false)
	}
	w.inherited = old.isSynced()
	w.staleFrom, w.restoredAt = old.stale(), old.restoredAt
	if rv := old.resourceVersion(); w.inherited && rv != "" {
		c := &carried{def: old.plan, rv: rv, relist: old.restoredRelist && !old.listed1(), unverified: old.warm() && !old.listed1()}
		if oc := old.carried; oc != nil && !old.listed1() {
			c = &carried{def: oc.def, rv: oc.rv, relist: oc.relist, unverified: oc.unverified}
		}
		c.relist = c.relist || !compiled.SameData(c.def, w.plan)
		w.carried = c
		w.rv.Store(&c.rv)
	}
	w.syncedAt.Store(old.syncedAt.Load())
	w.kept = map[string]bool{}
	for _, ix := range w.plan.Indexes {
		if old.indexSynced(ix.Name) && slices.ContainsFunc(old.plan.Indexes, func(was compiled.Index) bool { return was.Name == ix.Name }) {
			w.kept[ix.Name] = true
		}
	}
	// An index answers through its fallback and hints: it is kept only
	// when they are (one that a reload added is empty until the list).
	for _, ix := range w.plan.Indexes {
		for _, c := range []string{ix.Fallback, ix.Hints} {
			if c != "" && !w.kept[c] {
				delete(w.kept, ix.Name)
			}
		}
	}
	w.totals = old.totals
	for i, ix := range w.plan.Indexes {
		for j, was := range old.plan.Indexes {
			if was.Name == ix.Name {
				w.ruleErrors[i].Store(old.ruleErrors[j].Load())
			}
		}
	}
	w.failing.keep(&old.failing, func(index string) bool { return w.kept[index] })
}

// restClient boxes a rest.Interface for an atomic pointer.
type restClient struct{ rest.Interface }

// rest returns the watcher's REST client.
func (w *watcher) rest() rest.Interface { return w.client.Load().Interface }

// setClient makes c the watcher's REST client.
func (w *watcher) setClient(c rest.Interface) { w.client.Store(&restClient{c}) }

// rotate makes c the watcher's client and lists again through it at
// once; nothing leaves the answers meanwhile.
func (w *watcher) rotate(c rest.Interface) {
	w.reconnected.Store(true)
	w.setClient(c)
	// The new connection may reach another cluster (a kubeconfig
	// rewritten to point elsewhere), whose resourceVersions mean nothing
	// here: list again through it, which replaces this cluster's part in
	// place (no answer empties), rather than resume the watch.
	w.rotating.Store(true)
	w.listFresh.Store(true)
	if t := w.watching.Load(); t != nil {
		t.rotated.Store(true)
	}
	if f := w.relistNow.Load(); f != nil {
		(*f)()
	}
}

// objects returns the number of the watcher's objects in snap.
func (w *watcher) objects(snap *indexer.Snapshot) int {
	if w.clusterName == "" {
		return snap.ObjectCount(w.src)
	}
	return int(max(w.count.Load(), 0))
}

// run keeps the resource listed and watched until ctx ends. A resync period
// relists the resource that often.
//
// A run (one list, then watches) that ends for any other reason than a
// resync or ctx is a failure, even when the reflector returns nil, as it
// does for a watch that ends with an ERROR event or at once: the next run
// waits for the backoff. A 410 Gone (compaction) is relisted at once, but
// only as the first failure since the backoff was reset.
func (w *watcher) run(ctx context.Context) {
	defer w.ended()
	w.runCtx.Store(&ctx)
	logger := logr.FromSlogHandler(w.log.Handler())
	r := cache.NewReflectorWithOptions(lister{w}, &object{}, sink{w}, cache.ReflectorOptions{
		Name:            w.plan.Name,
		TypeDescription: w.plan.GVR.String(),
		Logger:          &logger,
	})
	if w.resumeRV != "" && !w.resumeOrList(ctx) {
		return
	}
	if w.resumeRV == "" && w.unverified() && w.cluster != nil {
		// Data of a snapshot that this watcher lists, not resumes (carried
		// over a reload, or to be listed): the cluster check still decides
		// whether it is dropped at once, and what later warm-start files record.
		// Best effort: the list replaces it anyway.
		checkCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, _ = w.cluster(checkCtx)
		cancel()
	}
	if w.identity != nil {
		// The identity that a check after trouble compares with.
		idCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, _, _ = w.identity.reread(idCtx, rereadEvery)
		cancel()
	}
	delay := newBackoff()
	streak := 0 // failed runs since the backoff was reset
	for ctx.Err() == nil {
		runCtx, cancel := context.WithCancel(ctx)
		var resynced atomic.Bool
		relist := func() { resynced.Store(true); cancel() }
		w.relistNow.Store(&relist)
		var timer gosync.WaitGroup
		if w.plan.Resync > 0 {
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
			w.fail(err)
		}
		streak++
		if streak == 1 && isExpired(w.lastError()) {
			continue // compaction: list again at once, once
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay.Step()):
		case <-w.wake: // another resource of the cluster is answered again
		}
	}
}

// ended stops the stale timer once run has returned: a watch that
// failed as the engine stopped marks nothing after.
func (w *watcher) ended() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.over = true
	if w.cutTimer != nil {
		w.cutTimer.Stop()
	}
	if w.dropTimer != nil {
		w.dropTimer.Stop()
	}
}

// lastError returns the last error since a watch was last established.
func (w *watcher) lastError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// resyncAfter calls resync once a resync period has passed after a
// complete list, to end the current list-and-watch so that run lists
// again. A list that takes longer than the period is never cut short.
func (w *watcher) resyncAfter(ctx context.Context, resync func()) {
	listed := w.relists.Load()
	t := time.NewTimer(w.plan.Resync)
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
		t.Reset(w.plan.Resync)
	}
}

// status reports the watcher's state. A resource is ready once it has
// synced, for as long as it has not gone staleAfter without an established
// watch since its first error: a list that works while the watch keeps
// failing does not make it fresh.
func (w *watcher) status(snap *indexer.Snapshot, staleAfter time.Duration) ResourceStatus {
	st := ResourceStatus{
		Name:           w.plan.Name,
		Cluster:        w.clusterName,
		Optional:       !w.required,
		GVR:            w.plan.GVR.String(),
		Namespace:      w.plan.Namespace,
		Objects:        w.objects(snap),
		Added:          w.added.Load(),
		Updated:        w.updated.Load(),
		Deleted:        w.deleted.Load(),
		Relists:        w.relists.Load(),
		ListErrors:     w.listErrors.Load(),
		WatchErrors:    w.watchErrors.Load(),
		Watches:        w.watches.Load(),
		Listed:         w.listed.Load(),
		Lists:          w.lists.Load(),
		ListSeconds:    time.Duration(w.listNanos.Load()).Seconds(),
		WatchesEnded:   w.watchesEnded.Load(),
		WatchSeconds:   time.Duration(w.watchNanos.Load()).Seconds(),
		ClusterChanges: w.clusterChanges.Load(),
		RuleErrors:     map[string]int64{},
	}
	if w.isSynced() {
		st.Synced = true
		if at := w.syncedAt.Load(); at != 0 {
			st.SyncedAt = time.Unix(0, at)
		}
	}
	st.Stale = w.stale()
	snapshot := w.staleSnapshot()
	for i, ix := range w.plan.Indexes {
		st.RuleErrors[ix.Public()] += w.ruleErrors[i].Load()
	}
	if n, last := w.failing.counts(); len(n) > 0 {
		st.Failing, st.LastRuleError = n, last
	}
	w.mu.Lock()
	if w.lastErr != nil {
		st.Error = w.lastErr.Error()
		st.ErrorSince = w.failingSince
	}
	w.mu.Unlock()
	// A resource that a reload started is syncing until its first list,
	// for as long as that can still come: not once its resource is not
	// served, nor once it has failed for staleAfter.
	failingLong := st.Error != "" && time.Since(st.ErrorSince) >= staleAfter
	st.Syncing = w.reloaded && !w.listed1() && !(w.gone.Load() && st.Error != "") && !failingLong
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
	case w.changing():
		st.Reason = "stale: the cluster behind the address changed (rebuilt, or its etcd restored): listing from scratch"
	case failingLong:
		st.Reason = fmt.Sprintf("watch failing for %s, no established watch (answers keep what it last knew, marked stale): %s", time.Since(st.ErrorSince).Round(time.Second), st.Error)
	default:
		st.Ready = true
	}
	return st
}
