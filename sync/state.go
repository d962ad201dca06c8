package sync

import (
	"context"
	"errors"
	"log/slog"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/sync/internal/follow"
	"k8s.io/client-go/rest"
)

// Options tune an Engine.
type Options struct {
	// Logger receives the engine's logs, client-go's reflector logs
	// included. Default: slog.Default().
	Logger *slog.Logger
	// StaleAfter is how long a synced resource may go without an
	// established watch, from its first list or watch error, before it
	// stops being ready. A list that works while the watch keeps failing
	// does not make the resource fresh again. Default 30s.
	StaleAfter time.Duration
	// SnapshotDir, when set, makes the engine start warm: New restores the
	// snapshot in it (see RestoreSnapshot) if there is one written for the
	// same resource entries, and Start writes one every SnapshotInterval
	// and once more when it stops (see WriteSnapshot). The folder must
	// exist and be the engine's alone.
	SnapshotDir string
	// SnapshotInterval: default DefaultSnapshotInterval.
	SnapshotInterval time.Duration
	// StreamingList lists each resource as the apiserver streams it: a
	// watch that sends the objects as events, then a bookmark
	// (sendInitialEvents, the watch-list feature), which the apiserver
	// serves from its watch cache without building the whole list in
	// memory. Measured, a cold start of many engines at once cost the
	// apiserver a seventh of the memory of their LISTs when they watched
	// most of their resource's objects, and as much or more when they
	// watched a small part of a large resource; more CPU and a longer
	// list in every case (BENCHMARKS.md, "Streaming lists"). A streaming list the apiserver refuses, or one
	// that fails, is made with LIST. Default false: every list is a LIST
	// request.
	StreamingList bool
	// StreamingListAuto streams the lists, as StreamingList does, of the
	// resources watched whole (no namespace, no label or field selector),
	// and lists the others with LIST. The apiserver streams a list from
	// its watch cache by walking every object of the resource and keeping
	// each one's event for the watcher, whatever its namespace or
	// selector, where a LIST of a namespace reads that namespace alone
	// and holds only what its selector keeps: a streaming list costs the
	// apiserver less than a LIST only when the watch takes its whole
	// resource (BENCHMARKS.md, "Streaming lists"). StreamingList, when
	// set, streams every list.
	StreamingListAuto bool
	// ClusterConfigs gives the REST config of clusters of the plan
	// (schema.Cluster) by name, in place of their kubeconfig files; the
	// config given to New is the one of the cluster without a kubeconfig.
	ClusterConfigs map[string]*rest.Config
	// KubeconfigInterval is how often the kubeconfig file of each cluster
	// is read again, to take a rotated credential or a new address
	// without a restart. Default DefaultKubeconfigInterval.
	KubeconfigInterval time.Duration
}

// streams reports whether the engine lists resource r by a streaming list
// (Options.StreamingList, StreamingListAuto).
func (e *Engine) streams(r *compiled.Resource) bool {
	return e.streaming || e.streamWhole && r.Namespace == "" && r.LabelSelector == "" && r.FieldSelector == ""
}

// testHookPublished, when set by a test, runs between the publication of
// a reload's view and the hub's marking of the subscriptions.
var testHookPublished func()

// errEmptyPlan is the error of a zero schema.Plan, which only Compile and
// LoadPlan can fill.
var errEmptyPlan = errors.New("an empty schema.Plan: build one with schema.Compile or schema.LoadPlan")

// DefaultStaleAfter is the default of Options.StaleAfter.
const DefaultStaleAfter = 30 * time.Second

// Engine keeps the indexes of a Plan in sync with a cluster. Reload
// changes its plan while it runs.
type Engine struct {
	inspector Inspector // the wider view of Inspect, pointing back here
	log       *slog.Logger
	store     *indexer.Store // its snapshots carry the engine's view (see view)
	started   atomic.Bool
	hub       *hub   // routes commits to subscriptions
	epoch     string // names this engine's run in subscription versions

	staleAfter  time.Duration
	streaming   bool // Options.StreamingList
	streamWhole bool // Options.StreamingListAuto
	warm        warmFiles
	ident       follow.Identity // the cluster's, and the snapshot's (see cluster.go)
	idents      identities      // those of each cluster, of a plan that reads several
	// clientFor gives a new watcher its REST client; nil for an engine
	// without a cluster.
	clientFor func(w *follow.Watcher) error
	// conns are the engine's connections, one per cluster; nil for an
	// engine without a cluster.
	conns *connections

	// mu serializes Reload, and Reload with Start's launching and its
	// stop; under it, runCtx is the context of Start (nil before) and
	// stopped is set once Start's context ended.
	mu      gosync.Mutex
	runCtx  context.Context
	stopped bool
	running gosync.WaitGroup // every watcher's run

	// staleCh is closed when Stale may have changed (see StaleChanged).
	staleMu gosync.Mutex
	staleCh chan struct{}

	conflicts conflictLog
}

// view is one configuration of the engine: the plan and its watchers and
// chains. Each Reconfigure of the store publishes one with the indexes,
// so that a reader that loads one snapshot sees indexes and chains of the
// same config.
type view struct {
	plan     *compiled.Plan
	watchers []*follow.Watcher    // in config order
	byName   map[string]*resource // resource name
	byIndex  map[string]*resource // index name
	chains   map[string]chain
	// parts reads each index's cluster parts (see partRead); nil for a
	// plan without clusters.
	parts map[string]partRead
}

// chain is one chain of a view.
type chain struct {
	indexes []string
	steps   []indexer.Index
}

// view returns the current view and the snapshot it came with.
func (e *Engine) view() (*view, *indexer.Snapshot) {
	snap := e.store.Snapshot()
	return snap.Meta().(*view), snap
}

// Inspector is the engine as the daemon's faces read it: everything of
// the Engine, and what an HTTP API, an xDS server or a facade adds to the
// Reader — answers with their freshness and version (Answers), each
// cluster's part (AnswerIn, ClusterStates), whether an index or a chain
// exists and is synced, conflicts, the subscriptions' counts, the
// snapshots' state, and the memory upkeep of a long-running process
// (Compact, Writes).
//
// A program that only reads (a library user's code, written against
// Reader) needs none of it; Engine keeps to the Reader and the lifecycle,
// and Engine.Inspect hands out this wider view. Every method may run in
// any goroutine, like the Reader's.
type Inspector struct {
	*Engine
}

// Inspect returns the engine's Inspector: the same engine, with the
// methods that the daemon's faces read besides the Reader. It allocates
// nothing.
func (e *Engine) Inspect() *Inspector { return &e.inspector }

// identities are the identities of the clusters of a plan that reads
// several, by cluster name (see identOf).
type identities struct {
	mu     gosync.Mutex
	byName map[string]*follow.Identity
}

// DefaultKubeconfigInterval is the default of Options.KubeconfigInterval.
const DefaultKubeconfigInterval = 5 * time.Second

// connections are an engine's connections to its clusters, by cluster
// name ("" for the one cluster of a plan without clusters).
type connections struct {
	every time.Duration
	// own is the engine's own connection (the cluster without a
	// kubeconfig), given the configs of Options.ClusterConfigs: what a
	// reload that adds a cluster builds its connection from.
	own   *rest.Config
	given map[string]*rest.Config

	mu     gosync.Mutex
	byName map[string]*connection
}

// connection is one cluster's: how its watchers get their clients, and,
// for a cluster of a kubeconfig file, the file's content last read.
type connection struct {
	name       string
	forWatcher func(w *follow.Watcher) (rest.Interface, error)
	// core is a client of the cluster's core API group: what reads its
	// identity (see identOf).
	core rest.Interface

	file, context string
	read          []byte // the content last read (taken or refused)
	inUse         []byte // the content of the connection in use
	// rotations counts the kubeconfigs taken after the first; errors
	// those refused (unreadable, invalid, or their apiserver refused
	// them), lastErr the latest refusal.
	rotations, errors int64
	lastErr           string
	// retryAt is when a kubeconfig refused because its apiserver did not
	// answer is tried again, unchanged; backoff the wait before it.
	retryAt time.Time
	backoff time.Duration
}

// DefaultSnapshotInterval is the default of Options.SnapshotInterval.
const DefaultSnapshotInterval = time.Minute

// warmFiles is the state of the engine's warm-start files (--snapshot-dir).
type warmFiles struct {
	dir      string
	interval time.Duration
	mu       gosync.Mutex // one write at a time; guards status
	status   SnapshotStatus
}

// resource is one resource entry of a view: its source and its watchers,
// one per cluster (one, of no cluster, for a plan without clusters).
type resource struct {
	plan  *compiled.Resource
	src   *indexer.Source
	parts []*follow.Watcher
}

// partRead is what reads one index's cluster parts in a view.
type partRead struct {
	ix indexer.Index
	// fallback is the index's fallback; hasFallback when it has one.
	fallback    indexer.Index
	hasFallback bool
}

// conflictLog writes the log line of keys put in conflict, at most one
// per index every conflictLogEvery: a flood of conflicting objects must
// not flood the log. A line says how many it stands for.
type conflictLog struct {
	mu   gosync.Mutex
	last map[string]time.Time
	held map[string]int // notes not logged since the last line, by index
}

const conflictLogEvery = 10 * time.Second

// journalSize bounds the changes an index remembers for resuming its
// index subscriptions: a subscriber that fell further behind, or asks for
// a version older than the first index subscription of its index, gets a
// reset.
const journalSize = 16384

// hub routes the store's commits to the subscriptions they affect. The
// store calls commit in commit order, after publishing and outside its
// publication lock (see indexer.Store.OnCommit); hub.mu is taken before a
// Subscription's mu, never after. What commit does under hub.mu is
// bounded whatever a commit's size: a large one gives its index
// subscriptions up to comparing the whole index (markKeys) and empties
// the journal rather than filling it.
type hub struct {
	mu      gosync.Mutex
	latest  *indexer.Snapshot // of the last commit that changed values, or of the last reload
	indexes map[indexer.Index]*indexSubs
	subs    map[*Subscription]struct{} // every open subscription

	opened    atomic.Int64 // open subscriptions
	coalesced atomic.Int64 // changes folded into one not yet taken
	resets    atomic.Int64 // resumes that could not resume
}

// indexSubs are the subscriptions of one index.
type indexSubs struct {
	keys    map[string]map[*Subscription]struct{} // key and chain subscriptions, by key
	nkeys   int                                   // registrations in keys: (key, subscription) pairs
	all     map[*Subscription]struct{}            // index subscriptions
	journal *journal                              // from the first index subscription on
	// at, while the index has index subscriptions: a snapshot that holds
	// the index's current values (that of its last change, or of the
	// first subscription, or of a Compact since). One for all of them: a
	// subscription that is caught up holds none of its own, and when a
	// reload rebinds it, its base is this.
	at *indexer.Snapshot
}

// journal remembers, for the last journalSize changed keys of an index,
// their values before the change, to resume index subscriptions.
type journal struct {
	entries []journalEntry // a ring
	next    int            // where the next entry goes
	full    bool
	floor   uint64 // changes after this seq are all remembered
}

type journalEntry struct {
	seq  uint64
	key  string
	prev []string
}

// identOf returns the identity of a cluster: the engine's own for ""
// (a plan without clusters), else the named cluster's, read through its
// current connection (none for an engine without connections: nothing
// to compare).
func (e *Engine) identOf(cluster string) *follow.Identity {
	if cluster == "" {
		return &e.ident
	}
	e.idents.mu.Lock()
	defer e.idents.mu.Unlock()
	if e.idents.byName == nil {
		e.idents.byName = map[string]*follow.Identity{}
	}
	id := e.idents.byName[cluster]
	if id == nil {
		id = &follow.Identity{}
		if conns := e.conns; conns != nil {
			id.Fetch = func(ctx context.Context, cached bool) (string, error) { return conns.fetchID(ctx, cluster, cached) }
		}
		e.idents.byName[cluster] = id
	}
	return id
}
