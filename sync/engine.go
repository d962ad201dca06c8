package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	gosync "sync"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	compiled "github.com/iidp/metasync/internal/plan"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/indexer"
	mschema "github.com/iidp/metasync/schema"
)

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
			home = follow.FetchClusterID(core)
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
		ident:       follow.Identity{Fetch: clusterID},
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
		case <-w.Synced:
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
func (v *view) unsynced() *follow.Watcher {
	for _, w := range v.watchers {
		if !w.Required {
			continue
		}
		select {
		case <-w.Synced:
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
		out[i] = ResourceStatus(w.Status(snap, e.staleAfter))
		out[i].LastRuleError = w.PublicFailures(out[i].LastRuleError)
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
