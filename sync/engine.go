package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	compiled "github.com/iidp/metasync/internal/plan"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/indexer"
	mschema "github.com/iidp/metasync/schema"
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
	ident       identity   // the cluster's, and the snapshot's (see cluster.go)
	idents      identities // those of each cluster, of a plan that reads several
	// clientFor gives a new watcher its REST client; nil for an engine
	// without a cluster.
	clientFor func(w *watcher) error
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
	watchers []*watcher           // in config order
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

// ResourceStatus is the state of one resource entry.
type ResourceStatus struct {
	Name string
	// Cluster is the cluster of this part of the resource, in a config
	// that reads several (one status per resource and cluster); "" else.
	Cluster string
	// Optional: the cluster is not required (its resources do not hold
	// back the engine's readiness).
	Optional  bool
	GVR       string
	Namespace string
	// Ready is Synced, and the resource has not gone longer than
	// Options.StaleAfter without an established watch since its first
	// error; Reason says why not.
	Ready  bool
	Reason string
	// Syncing: a reload added the resource, or changed its definition,
	// and its first list since has not completed yet but still may: its
	// resource is served and it has not failed for StaleAfter. An added
	// one is not Synced, answers nothing yet, and does not count against
	// the engine's readiness (Engine.Ready) while Syncing. A changed one
	// answers from its previous definition meanwhile and counts as any
	// synced resource does: not ready once its watch has failed
	// StaleAfter, or at once when its new resource is not served.
	Syncing bool
	// Synced: the resource has data to answer with, from a complete list
	// or from a snapshot (Options.SnapshotDir).
	Synced bool
	// Stale: its data came from a snapshot and its watch has not caught
	// up with the apiserver yet, or its watch has failed longer than
	// Options.StaleAfter (cut off: Error says why); it is not Ready
	// meanwhile.
	Stale    bool
	SyncedAt time.Time
	Objects  int
	// Error is the last list or watch error, "" once a watch is
	// established again (it stayed open a second without an error);
	// a list that works does not clear it.
	Error string
	// ErrorSince is when the trouble began: the first error since a watch
	// was last established.
	ErrorSince time.Time
	// Events applied, by type, and complete lists (relists included).
	Added   int64
	Updated int64
	Deleted int64
	Relists int64
	// ClusterChanges counts the lists from scratch because the cluster
	// behind the address changed: rebuilt (another kube-system UID) or
	// gone back in time (etcd restored from a backup); see rebuilt.go.
	ClusterChanges int64
	// Failed list and watch requests; WatchErrors also counts watches
	// that ended with an ERROR event or before they were established.
	ListErrors  int64
	WatchErrors int64
	// Watches counts the watch requests that started (restarts included).
	Watches int64
	// Listed is the number of objects decoded by the current or last list,
	// to show progress of a long initial sync.
	Listed int64
	// Lists counts the list requests that ended (each page of a paged
	// list apart; a stop's not), ListSeconds their time in all;
	// WatchesEnded counts the watches that ended, WatchSeconds how long
	// they stayed open in all. Short watches and a high rate of lists
	// show a resource that cannot keep a watch.
	Lists        int64
	ListSeconds  float64
	WatchesEnded int64
	WatchSeconds float64
	// RuleErrors counts, per index, objects whose rule could not be
	// evaluated (an object where a string was wanted, say).
	RuleErrors map[string]int64
	// Failing counts, per index, the objects whose rule fails now: they
	// add nothing to it until an event or a list gives them again with
	// rules that work, or they are deleted. LastRuleError is the latest
	// failure of each of those indexes. An index none of whose objects
	// fails is in neither.
	Failing       map[string]int
	LastRuleError map[string]RuleFailure
}

// New builds an Engine. It checks the plan against nothing remote: a
// missing CRD shows up later, in the resource's status.
func New(plan *mschema.Plan, cfg *rest.Config, opts Options) (*Engine, error) {
	if plan == nil || cfg == nil {
		return nil, errors.New("sync.New needs a plan and a rest config")
	}
	cp := compiled.Of(plan)
	if cp == nil {
		return nil, errEmptyPlan
	}
	configs := map[string]*rest.Config{"": cfg}
	var read map[string][]byte
	if len(cp.Clusters) > 0 {
		var err error
		if configs, read, err = clusterConfigs(cp, cfg, opts.ClusterConfigs); err != nil {
			return nil, err
		}
	}
	conns := &connections{byName: map[string]*connection{}, every: opts.KubeconfigInterval, own: cfg, given: opts.ClusterConfigs}
	if conns.every <= 0 {
		conns.every = DefaultKubeconfigInterval
	}
	var home func(context.Context, bool) (string, error)
	for name, cfg := range configs {
		forWatcher, core, err := clientsOf(cfg)
		if err != nil {
			if name != "" {
				err = fmt.Errorf("cluster %s: %w", name, err)
			}
			return nil, err
		}
		c := &connection{name: name, forWatcher: forWatcher, core: core}
		for _, pc := range cp.Clusters {
			if pc.Name == name && pc.Kubeconfig != "" && opts.ClusterConfigs[name] == nil {
				c.file, c.context = pc.Kubeconfig, pc.Context
				c.read, c.inUse = read[name], read[name]
			}
		}
		conns.byName[name] = c
		if name == "" || home == nil && cfg == configs[homeOf(cp)] {
			home = fetchClusterID(core)
		}
	}
	return newEngine(cp, opts, conns, home)
}

// homeOf names the home cluster of p; "" for none.
func homeOf(p *compiled.Plan) string {
	for _, c := range p.Clusters {
		if c.Home {
			return c.Name
		}
	}
	return ""
}

// clientsOf builds, for one cluster's config, the function that gives a
// watcher its REST client and a client of the core API group; the
// clients of one cluster share one HTTP client.
func clientsOf(cfg *rest.Config) (func(w *watcher) (rest.Interface, error), rest.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.AcceptContentTypes = "application/json"
	cfg.ContentType = "application/json"
	if cfg.UserAgent == "" {
		cfg.UserAgent = "metasync"
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("build HTTP client: %w", err)
	}
	clientFor := func(w *watcher) (rest.Interface, error) {
		r := w.plan
		rc := rest.CopyConfig(cfg)
		gv := schema.GroupVersion{Group: r.GVR.Group, Version: r.GVR.Version}
		rc.GroupVersion = &gv
		rc.APIPath = "/apis"
		if gv.Group == "" {
			rc.APIPath = "/api"
		}
		rc.NegotiatedSerializer = &codec{project: w.project}
		client, err := rest.RESTClientForConfigAndClient(rc, httpClient)
		if err != nil {
			return nil, fmt.Errorf("resource %s: %w", r.Name, err)
		}
		return client, nil
	}
	core := rest.CopyConfig(cfg)
	core.GroupVersion, core.APIPath = &schema.GroupVersion{Version: "v1"}, "/api"
	core.NegotiatedSerializer = &codec{project: func(string) *object { return &object{} }}
	coreClient, err := rest.RESTClientForConfigAndClient(core, httpClient)
	if err != nil {
		return nil, nil, fmt.Errorf("build the core API client: %w", err)
	}
	return clientFor, coreClient, nil
}

// newEngine builds an Engine of a compiled plan; conns, when not nil,
// are its connections, which give each watcher its client (and each
// cluster of a plan that reads several its identity), and clusterID reads
// the identity of the cluster of a plan without clusters.
func newEngine(plan *compiled.Plan, opts Options, conns *connections, clusterID func(context.Context, bool) (string, error)) (*Engine, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	store, err := indexer.New()
	if err != nil {
		return nil, err
	}
	e := &Engine{
		log:         log,
		store:       store,
		staleAfter:  opts.StaleAfter,
		streaming:   opts.StreamingList,
		streamWhole: opts.StreamingListAuto,
		ident:       identity{fetch: clusterID},
		conns:       conns,
	}
	e.inspector.Engine = e
	if conns != nil {
		e.clientFor = conns.clientFor
	}
	if e.staleAfter <= 0 {
		e.staleAfter = DefaultStaleAfter
	}
	e.hub, e.epoch = newHub(store), newEpoch()
	store.OnConflict(e.noteConflict)
	e.store.Reconfigure(nil, func(map[string]*indexer.Source, *indexer.Snapshot) any { return &view{} })
	if _, err := e.apply(plan, false); err != nil {
		return nil, err
	}
	if opts.SnapshotDir != "" {
		e.warm.dir, e.warm.interval = opts.SnapshotDir, opts.SnapshotInterval
		if e.warm.interval <= 0 {
			e.warm.interval = DefaultSnapshotInterval
		}
		e.loadWarmFile()
	}
	return e, nil
}

// Start runs one watch per resource and blocks until ctx ends and every
// goroutine it started (those of reloads included) has exited. It returns
// an error only when the engine was started before.
func (e *Engine) Start(ctx context.Context) error {
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("engine already started")
	}
	e.mu.Lock()
	e.runCtx = ctx
	v, _ := e.view()
	e.log.Info("engine starting", "resources", len(v.watchers))
	for _, w := range v.watchers {
		e.launch(w)
	}
	e.mu.Unlock()
	var writer gosync.WaitGroup
	if e.warm.dir != "" {
		writer.Go(func() { e.writeWarmFiles(ctx) })
	}
	if e.conns != nil {
		writer.Go(func() { e.followKubeconfigs(ctx) })
	}
	writer.Go(func() { e.watchIdentities(ctx) })
	<-ctx.Done()
	e.mu.Lock()
	e.stopped = true // no reload launches a watch from now on
	e.mu.Unlock()
	e.running.Wait()
	writer.Wait()
	if e.warm.dir != "" && e.writeWarmFile() == nil {
		st := e.Inspect().SnapshotStatus()
		e.log.Info("snapshot written", "objects", st.Objects, "bytes", st.Bytes, "took", st.WriteDuration.Round(time.Microsecond).String())
	}
	e.log.Info("engine stopped")
	return nil
}

// launch runs w until the engine stops or a reload stops w; under e.mu.
func (e *Engine) launch(w *watcher) {
	if e.runCtx == nil || e.stopped {
		return
	}
	ctx, cancel := context.WithCancel(e.runCtx)
	w.cancel, w.done = cancel, make(chan struct{})
	e.running.Go(func() {
		defer close(w.done)
		w.run(ctx)
	})
}

// halt stops w's run and waits for it to exit: after halt, w writes
// nothing; under e.mu.
func (w *watcher) halt() {
	if w.cancel != nil {
		w.cancel()
		<-w.done
	}
}

// Reload makes plan the engine's plan while it runs, and returns what
// changed. Resource entries are compared by what defines them (GVR,
// namespace, selectors, resync, fields, index rules and bounds):
//
//   - a resource entry that did not change keeps its watch, its resourceVersion,
//     its indexes and their subscribers: nothing is asked of the apiserver;
//   - a changed entry restarts alone: its indexes keep answering from the
//     old definition until its first list with the new one, which changes
//     only what differs (as a relist does), so subscribers hear of the
//     differences only;
//   - a removed entry stops: its indexes and the chains through them are
//     gone, and their subscriptions end with EventGone;
//   - an added entry starts: its indexes are there at once, not synced
//     until its first list (ResourceStatus.Syncing).
//
// Lookups switch from the old indexes and chains to the new ones at one
// instant: no lookup sees an index of one plan with a chain of another.
// An index that moves to another resource entry is a new index. Reloads
// are serialized; Reload may be called before Start.
func (e *Engine) Reload(plan *mschema.Plan) (mschema.Changes, error) {
	if plan == nil {
		return mschema.Changes{}, errors.New("Reload needs a plan")
	}
	cp := compiled.Of(plan)
	if cp == nil {
		return mschema.Changes{}, errEmptyPlan
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.apply(cp, true)
}

// WaitForSync blocks until every resource has completed its first list
// (after a warm start: has caught up with the apiserver), or ctx ends; then
// the error names the resources still waiting and why. See WaitForData for
// a caller that can use stale answers.
func (e *Engine) WaitForSync(ctx context.Context) error {
	for {
		v, _ := e.view()
		w := v.unsynced()
		if w == nil {
			return nil
		}
		select {
		case <-w.synced:
		case <-ctx.Done():
			var waiting []string
			for _, st := range e.Status() {
				if !st.Synced || st.Stale {
					reason := st.Error
					if reason == "" {
						reason = "no list completed yet"
					}
					waiting = append(waiting, st.Name+" ("+reason+")")
				}
			}
			return fmt.Errorf("not synced: %s: %w", strings.Join(waiting, ", "), ctx.Err())
		}
	}
}

// unsynced returns a watcher of v that has not completed its first list,
// or nil.
func (v *view) unsynced() *watcher {
	for _, w := range v.watchers {
		if !w.required {
			continue
		}
		select {
		case <-w.synced:
		default:
			return w
		}
	}
	return nil
}

// Synced reports whether every resource has completed its first list.
func (e *Inspector) Synced() bool {
	v, _ := e.view()
	return v.unsynced() == nil
}

// Ready reports whether every resource is ready (see ResourceStatus.Ready),
// leaving out those a reload added that have not listed yet.
func (e *Engine) Ready() bool {
	for _, st := range e.Status() {
		if !st.Ready && !(st.Syncing && !st.Synced) && !st.Optional {
			return false
		}
	}
	return true
}

// Status returns the state of every resource, in config order.
func (e *Engine) Status() []ResourceStatus {
	v, snap := e.view()
	out := make([]ResourceStatus, len(v.watchers))
	for i, w := range v.watchers {
		out[i] = w.status(snap, e.staleAfter)
		out[i].LastRuleError = w.publicFailures(out[i].LastRuleError)
	}
	return out
}

// Compact moves the indexes' tables into fresh memory (see
// indexer.Store.Compact): after heavy churn, the current pages of the
// tables lie scattered among heap spans that their old copies filled, and
// keep those spans resident. The answers do not change and no subscriber
// hears of it. It costs one copy of the tables' pages, made without
// stopping writers (a write that comes meanwhile wins, and Compact gives
// up): call it when writes have quieted (see Writes), followed by
// runtime/debug.FreeOSMemory to give the spans back. It compacts only
// after writes in number at least a quarter of the tables' pages since the
// last time, and reports whether it did. The daemon calls it each time
// writes have paused for a few seconds; a library host decides for itself
// (the engine never does it on its own).
func (e *Inspector) Compact() bool { return e.store.Compact() }

// Writes counts the engine's writes that changed its indexes (list and
// watch events that changed some key's values, reloads, restores) since
// it was built; events that changed only fields, or nothing the indexes
// hold, do not count. Equal counts some seconds apart mean the indexes
// have quieted.
func (e *Inspector) Writes() uint64 { return e.store.Snapshot().Writes() }
