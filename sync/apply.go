package sync

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
	mschema "github.com/iidp/metasync/schema"
)

// switchover is one plan's move onto the running engine (apply): the
// watchers it builds, those it halts, and which resource each belongs to
// after the move.
type switchover struct {
	e      *Engine
	old    *view
	plan   *compiled.Plan
	d      compiled.Diff
	reload bool
	// unchanged: cluster name -> same settings as before, when a reload
	// changes the clusters (nil otherwise).
	unchanged map[string]bool
	built     []*follow.Watcher
	// fresh: the parts of each resource that starts or restarts, every
	// part of it; regrouped: a kept resource whose clusters changed, with
	// its parts (some kept, some fresh).
	fresh, regrouped map[string][]*follow.Watcher
	halting          []*follow.Watcher // parts of kept resources that stop
	dropped          []*follow.Watcher // parts whose cluster the resource no longer reads
}

// apply switches the engine to plan; under e.mu, or before the engine is
// shared. reload marks what it starts as started by a reload.
func (e *Engine) apply(plan *compiled.Plan, reload bool) (mschema.Changes, error) {
	old, _ := e.view()
	oldPlan := old.plan
	if oldPlan == nil {
		oldPlan = &compiled.Plan{}
	}
	d := compiled.Compare(oldPlan, plan)
	changes := mschema.Changes{Start: d.Start, Stop: d.Stop, Restart: d.Restart, Keep: d.Keep,
		ChainsAdded: d.ChainsAdded, ChainsRemoved: d.ChainsRemoved, ChainsChanged: d.ChainsChanged, Unique: d.Unique}
	sw := &switchover{e: e, old: old, plan: plan, d: d, reload: reload,
		fresh: map[string][]*follow.Watcher{}, regrouped: map[string][]*follow.Watcher{}}

	// Clusters that a reload adds, removes or changes: only their
	// watches start or stop (see connections.reconnect).
	var installConns func()
	if reload && len(oldPlan.Resources) > 0 && !slices.Equal(oldPlan.Clusters, plan.Clusters) {
		if (len(oldPlan.Clusters) == 0) != (len(plan.Clusters) == 0) || e.conns == nil {
			return changes, errors.New("clusters: going from one cluster to several, or back, takes a restart (object keys change)")
		}
		var err error
		if sw.unchanged, installConns, err = e.conns.reconnect(oldPlan, plan); err != nil {
			return changes, err
		}
	}
	// Build the new watchers and their clients first: a failure here
	// changes nothing.
	sw.buildWatchers()
	if installConns != nil {
		installConns()
		// A cluster added or changed: its identity is read through its
		// new connection.
		for _, c := range plan.Clusters {
			if !sw.unchanged[c.Name] {
				e.identOf(c.Name).Forget()
			}
		}
	}
	if e.clientFor != nil {
		for _, w := range sw.built {
			if err := e.clientFor(w); err != nil {
				return changes, err
			}
		}
	}
	sw.haltOld()
	retired, err := e.store.Reconfigure(sourceSpecs(plan), func(sources map[string]*indexer.Source, snap *indexer.Snapshot) any {
		return sw.nextView(sources, snap)
	})
	if err != nil {
		// The plan was compiled: its names are unique. Should it happen,
		// restart what was halted as it was.
		sw.relaunchHalted()
		return changes, err
	}
	if testHookPublished != nil {
		testHookPublished()
	}
	e.hub.reconfigure(e, retired)
	e.staleMayHaveChanged()
	if len(sw.dropped) > 0 {
		now, _ := e.view()
		for _, w := range sw.dropped {
			if res := now.byName[w.Plan.Name]; res != nil {
				res.src.ReplaceWithin(w.KeyPrefix, nil)
			}
		}
	}
	for _, w := range sw.built {
		e.launch(w)
	}
	if reload && !changes.None() {
		e.logReload(changes)
	}
	return changes, nil
}

// buildWatchers builds the watchers of what starts, restarts or changes
// clusters: one per cluster of the resource (one without clusters).
func (sw *switchover) buildWatchers() {
	e, plan := sw.e, sw.plan
	required := map[string]bool{}
	dropAfter := map[string]time.Duration{}
	for _, c := range plan.Clusters {
		required[c.Name], dropAfter[c.Name] = c.Required, c.DropAfter
	}
	build := func(r *compiled.Resource, cluster string) *follow.Watcher {
		w := follow.NewWatcher(r, cluster, e.log)
		w.Required, w.DropAfter = cluster == "" || required[cluster], dropAfter[cluster]
		w.Streaming.Store(e.streams(r))
		w.Reloaded = sw.reload
		w.Cluster = func(ctx context.Context) (follow.Verdict, error) { return e.checkCluster(ctx, cluster) }
		w.Identity = e.identOf(cluster)
		w.Changed = func(ctx context.Context, why string) { e.clusterChanged(ctx, cluster, why) }
		w.Recovered = func() { e.recovered(w) }
		w.Freshened, w.StaleAfter = e.staleMayHaveChanged, e.staleAfter
		sw.built = append(sw.built, w)
		return w
	}
	for _, r := range plan.Resources {
		clusters := plan.ClustersOf(r)
		if len(clusters) == 0 {
			clusters = []string{""}
		}
		if !slices.Contains(sw.d.Keep, r.Name) {
			for _, cluster := range clusters {
				sw.fresh[r.Name] = append(sw.fresh[r.Name], build(r, cluster))
			}
			continue
		}
		if sw.unchanged == nil {
			continue
		}
		was := sw.old.byName[r.Name]
		var parts []*follow.Watcher
		changed := false
		for _, cluster := range clusters {
			i := slices.IndexFunc(was.parts, func(w *follow.Watcher) bool { return w.ClusterName == cluster })
			if i >= 0 && sw.unchanged[cluster] {
				parts = append(parts, was.parts[i])
				continue
			}
			parts, changed = append(parts, build(r, cluster)), true
		}
		for _, w := range was.parts {
			if !slices.Contains(parts, w) {
				sw.halting, changed = append(sw.halting, w), true
			}
		}
		if changed {
			sw.regrouped[r.Name] = parts
		}
	}
}

// haltOld stops what stops or restarts: once halted, a watcher writes
// nothing. A restarted resource's watcher of a cluster takes over the one
// of the same cluster; a cluster the resource no longer reads leaves its
// objects behind, in dropped, removed once the new view is published.
func (sw *switchover) haltOld() {
	takeOver := func(w *follow.Watcher, next []*follow.Watcher) {
		w.Halt()
		for _, n := range next {
			if n.ClusterName == w.ClusterName && slices.Contains(sw.built, n) {
				n.Inherit(w)
				if n.Carried != nil && sw.unchanged != nil && !sw.unchanged[n.ClusterName] {
					// The cluster's connection changed: its data may be
					// another cluster's until the list.
					n.Carried.Relist = true
				}
				return
			}
		}
		sw.dropped = append(sw.dropped, w)
	}
	for _, name := range append(slices.Clone(sw.d.Stop), sw.d.Restart...) {
		for _, w := range sw.old.byName[name].parts {
			if sw.fresh[name] == nil {
				w.Halt() // the resource stops: its source goes
				continue
			}
			takeOver(w, sw.fresh[name])
		}
	}
	for _, w := range sw.halting {
		takeOver(w, sw.regrouped[w.Plan.Name])
	}
}

// relaunchHalted starts again, as they were, the watchers haltOld halted.
func (sw *switchover) relaunchHalted() {
	for _, name := range append(slices.Clone(sw.d.Stop), sw.d.Restart...) {
		for _, w := range sw.old.byName[name].parts {
			sw.e.launch(w)
		}
	}
	for _, w := range sw.halting {
		sw.e.launch(w)
	}
}

// nextView is the view of the new plan over the reconfigured store's
// sources and snapshot: kept resources keep their source and watchers.
func (sw *switchover) nextView(sources map[string]*indexer.Source, snap *indexer.Snapshot) *view {
	plan := sw.plan
	next := &view{plan: plan, byName: map[string]*resource{}, byIndex: map[string]*resource{}, chains: map[string]chain{}}
	for _, r := range plan.Resources {
		res := sw.old.byName[r.Name] // kept: its source and watchers are the same
		ws := sw.fresh[r.Name]
		if ws == nil {
			ws = sw.regrouped[r.Name]
		}
		if ws != nil {
			res = &resource{plan: r, src: sources[r.Name], parts: ws}
			for _, w := range ws {
				w.Src = res.src
			}
		}
		next.watchers = append(next.watchers, res.parts...)
		next.byName[r.Name] = res
		for _, ix := range r.Indexes {
			if !ix.Hidden() { // read through the index it serves
				next.byIndex[ix.Name] = res
			}
		}
	}
	for _, ch := range plan.Chains {
		steps := make([]indexer.Index, len(ch.Indexes))
		for i, name := range ch.Indexes {
			steps[i], _ = snap.Index(name)
		}
		next.chains[ch.Name] = chain{indexes: ch.Indexes, steps: steps}
	}
	next.parts = partReads(plan, snap)
	return next
}

// sourceSpecs is the store's layout of plan: a source per resource entry.
func sourceSpecs(plan *compiled.Plan) []indexer.SourceSpec {
	var specs []indexer.SourceSpec
	for _, r := range plan.Resources {
		// Object keys per index key serve typed access, which needs fields.
		// Of several clusters, they also tell each cluster's part (parts.go).
		several := len(plan.Clusters) > 0
		spec := indexer.SourceSpec{Name: r.Name, Objects: len(r.Fields) > 0 || several, Parts: several}
		for _, ix := range r.Indexes {
			spec.Indexes = append(spec.Indexes, ix.Name)
			if ix.Fallback != "" {
				if spec.Fallbacks == nil {
					spec.Fallbacks = map[string]string{}
				}
				spec.Fallbacks[ix.Name] = ix.Fallback
			}
			if ix.Unique {
				spec.Unique = append(spec.Unique, ix.Name)
			}
			if ix.Hints != "" {
				if spec.Hints == nil {
					spec.Hints = map[string]string{}
				}
				spec.Hints[ix.Name] = ix.Hints
			}
		}
		specs = append(specs, spec)
	}
	return specs
}

// logReload logs what a reload changed.
func (e *Engine) logReload(changes mschema.Changes) {
	attrs := []any{"keep", len(changes.Keep)}
	for _, l := range []struct {
		name  string
		names []string
	}{{"start", changes.Start}, {"stop", changes.Stop}, {"restart", changes.Restart},
		{"chainsAdded", changes.ChainsAdded}, {"chainsRemoved", changes.ChainsRemoved}, {"chainsChanged", changes.ChainsChanged}, {"uniqueChanged", changes.Unique}} {
		if len(l.names) > 0 {
			attrs = append(attrs, l.name, l.names)
		}
	}
	e.log.Info("config reloaded", attrs...)
}

// launch runs w until the engine stops or a reload stops w; under e.mu.
func (e *Engine) launch(w *follow.Watcher) {
	if e.runCtx == nil || e.stopped {
		return
	}
	ctx, cancel := context.WithCancel(e.runCtx)
	w.Cancel, w.Done = cancel, make(chan struct{})
	e.running.Go(func() {
		defer close(w.Done)
		w.Run(ctx)
	})
}
