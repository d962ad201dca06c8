package follow

import (
	"context"
	"log/slog"
	gosync "sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
)

// Watcher runs the watch of one resource entry and feeds its source in the
// indexer. It is the reflector's store: the reflector hands it projected
// objects, never raw ones.
type Watcher struct {
	Plan *compiled.Resource
	Log  *slog.Logger
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
	// Reconnected: rotate gave the watcher a new connection, and no list
	// through it has completed since: its data may be another cluster's,
	// which a snapshot marks to be listed, not resumed.
	Reconnected atomic.Bool
	Src         *indexer.Source // set when the engine publishes the watcher
	// Cluster checks the cluster against the snapshot's (see
	// Engine.checkCluster); set with client.
	Cluster func(context.Context) (Verdict, error)
	// ClusterName is the cluster the watcher reads, of a plan that
	// reads several ("" otherwise); keyPrefix, "NAME:" then, begins the
	// key of each of its objects in the source, which the watchers of
	// the resource's other clusters share; required: the resource is
	// synced only once this watcher is (the cluster's required). Set
	// before the watcher is used.
	ClusterName, KeyPrefix string
	Required               bool
	// Count is the number of the watcher's objects, kept where the
	// source holds other watchers' objects too (clusterName != "").
	Count atomic.Int64
	// contact: unix nanos when the apiserver was last heard from (see
	// lastContact).
	contact atomic.Int64
	// ReportSkipped: the Feed (NewOffline) reads which rules skipped an
	// object (object.skipped); set before the watcher is used.
	ReportSkipped atomic.Bool

	// Set by Engine.launch, under the engine's mu: cancel stops run, done
	// is closed when it has returned.
	Cancel context.CancelFunc
	Done   chan struct{}
	// Reloaded: a reload started this watcher (Status.Syncing
	// until its first list); inherited: it restarts a resource whose
	// previous watcher had synced, so that the indexes the two share
	// (kept) hold that one's answers until the first list. Set before
	// the watcher is published.
	Reloaded, inherited bool
	kept                map[string]bool

	// Restored: the resource's objects came from a snapshot (see
	// sync/warmstart.go), and resumeRV is the resourceVersion its watch resumes
	// from ("" when the snapshot's data must be listed: restoredRelist).
	// Set before Start. Until the watch has caught up (synced is closed),
	// the resource is stale. SnapshotDropped: the snapshot turned out to be of
	// another cluster, and its data was cleared (see Engine.checkCluster).
	Restored, RestoredRelist bool
	ResumeRV                 string
	SnapshotDropped          atomic.Bool
	// Carried: the source holds what a previous definition of the resource entry
	// answered, and this watcher has not listed yet (see inherit); nil
	// otherwise. Snapshots write it until the first list.
	Carried *carried
	// RestoredAt is when the snapshot the data came from was written;
	// staleFrom: a reload restarted a resource that was stale, whose data
	// this one answers with until its first list.
	RestoredAt time.Time
	staleFrom  bool
	// Loaded is closed once a restored source can be written (see
	// indexer.Source.Load); nil when not restored.
	Loaded <-chan struct{}
	// rv is the resourceVersion of the last write to the source (an
	// event's, a list's or a bookmark's), stored after the write: what a
	// snapshot of the source resumes from.
	RV atomic.Pointer[string]

	Synced     chan struct{} // closed after the first complete list
	syncedOnce gosync.Once
	syncedAt   atomic.Int64 // unix nanos of the first sync

	Mu      gosync.Mutex
	lastErr error // the last list or watch error since a watch was last established
	// FailingSince is the time of the first error since a watch was last
	// established: a successful list does not reset it, an established
	// watch does.
	FailingSince time.Time
	// phase is the watcher's Phase in an outage: cut off (the watch
	// failed for staleAfter since FailingSince, none established since:
	// the answers keep what the resource last knew, marked stale, until a
	// watch is established again), its part dropped (DropAfter passed:
	// the part comes back with the next list). cutTimer and dropTimer
	// make those moves.
	phase     atomic.Uint32
	over      bool // run returned: no timer acts after (under Mu)
	cutTimer  *time.Timer
	DropAfter time.Duration // the cluster's dropAfter; 0: never
	dropTimer *time.Timer
	// RelistNow ends the current run to list again at once (as a resync).
	RelistNow atomic.Pointer[func()]
	// troubled: a list or watch failed, or a watch ended before its
	// timeout, since the cluster was last checked; the next watch checks
	// it first (see sync/rebuilt.go). rebuilt: the cluster changed behind its
	// address, and the list from scratch is not done yet (stale until
	// then). identity is the cluster's (nil for an engine without one);
	// changed relists every resource of the cluster from scratch;
	// recovered wakes the cluster's other resources (wake) once this one
	// is answered again. Set before the watcher is used.
	troubled, Rebuilt atomic.Bool
	// Listing: a list is under way (recovered leaves it be); kicked: the
	// watcher woke the cluster's others in this outage (see
	// answeredAgain); runCtx is its run's context, which requests made
	// on its behalf end with.
	Listing, kicked atomic.Bool
	runCtx          atomic.Pointer[context.Context]
	// Answered: the last request to the apiserver worked (a list, or a
	// watch established); fail clears it. Clusters reports a cluster
	// connected by it, where Error keeps the trouble until a watch is
	// established.
	Answered   atomic.Bool
	Identity   *Identity
	Changed    func(ctx context.Context, why string)
	Recovered  func()
	Wake       chan struct{}
	StaleAfter time.Duration
	listed     atomic.Int64 // objects decoded by the current list

	established atomic.Int64 // unix nanos: the first watch established in the current run, 0 if none yet
	Streaming   atomic.Bool  // lists are streamed (Options.StreamingList, see listByWatch) until the apiserver refuses one
	refused     atomic.Bool  // the apiserver refused a streaming list: the watcher that replaces this one at a reload lists too
	gone        atomic.Bool  // the apiserver answers 404: the resource is not served (CRD deleted?)

	*totals                   // the resource's, shared with the watchers it restarts
	ruleErrors []atomic.Int64 // per index of the resource
	ruleLog    rate.Sometimes
	// Failing: the objects whose rule fails now, per index.
	Failing FailingSet
	// Freshened, if set, is called when the resource may no longer be
	// stale: its first list or catch-up, a snapshot dropped.
	Freshened func()
}

// totals are what a resource has done since the engine started: a
// watcher that restarts the resource (a reload) takes its predecessor's,
// halted by then, and goes on counting in them.
type totals struct {
	failures atomic.Int64 // errors recorded by fail
	watches  atomic.Int64 // watch requests that started

	Added, updated, Deleted, relists, listErrors, watchErrors atomic.Int64
	// ClusterChanges: lists from scratch because the cluster behind the
	// address changed (see sync/rebuilt.go).
	ClusterChanges atomic.Int64
	// Requests that ended, and how long they took, in nanoseconds: lists
	// (all pages of one) and watches (from their start to their end).
	lists, listNanos, watchesEnded, watchNanos atomic.Int64
}

// NoteFresh calls freshened, if set.
func (w *Watcher) NoteFresh() {
	if w.Freshened != nil {
		w.Freshened()
	}
}

// The reflector's two ends are two types: lister lists and watches the
// apiserver (listwatch.go), sink takes what the reflector read into the
// source (store.go); the watcher behind both keeps their shared state.
type (
	lister struct{ w *Watcher }
	sink   struct{ w *Watcher }
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

func NewWatcher(plan *compiled.Resource, cluster string, log *slog.Logger) *Watcher {
	log = log.With("resource", plan.Name)
	prefix := ""
	if cluster != "" {
		log, prefix = log.With("cluster", cluster), cluster+":"
	}
	return &Watcher{
		Plan:        plan,
		ClusterName: cluster,
		KeyPrefix:   prefix,
		Required:    true,
		Log:         log,
		Synced:      make(chan struct{}),
		Wake:        make(chan struct{}, 1),
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
	RV                 string
	Relist, Unverified bool
}

// restClient boxes a rest.Interface for an atomic pointer.
type restClient struct{ rest.Interface }

// rest returns the watcher's REST client.
func (w *Watcher) rest() rest.Interface { return w.client.Load().Interface }

// SetClient makes c the watcher's REST client.
func (w *Watcher) SetClient(c rest.Interface) { w.client.Store(&restClient{c}) }

// ResourceVersion returns the resourceVersion the source is as of, at
// least: every write before it is in the source.
func (w *Watcher) ResourceVersion() string {
	if p := w.RV.Load(); p != nil {
		return *p
	}
	return ""
}

// trackedWatch hands the events of one watch request to the reflector and
// tells the watcher how the watch went. client-go's reflector returns no
// error for a watch that ends with an ERROR event or ends at once (it lists
// again), so without this the watcher would see neither.
type trackedWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  gosync.Once
	// rotated: ended to go on through a new connection (see rotate),
	// which is no failure.
	rotated atomic.Bool
}

func (t *trackedWatch) ResultChan() <-chan watch.Event { return t.out }

func (t *trackedWatch) Stop() {
	t.once.Do(func() {
		close(t.stop)
		t.inner.Stop()
	})
}

func (t *trackedWatch) stopped() bool {
	select {
	case <-t.stop:
		return true
	default:
		return false
	}
}
