package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/hashicorp/go-multierror"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/internal/warmfile"
)

// SnapshotStatus returns the state of the engine's snapshots.
func (e *Inspector) SnapshotStatus() SnapshotStatus {
	e.warm.mu.Lock()
	defer e.warm.mu.Unlock()
	st := e.warm.status
	st.Clusters = slices.Clone(st.Clusters)
	return st
}

// RestoreSnapshot fills the indexes from a snapshot that WriteSnapshot
// wrote for the same resource entries (same GVRs, namespaces, selectors,
// fields and index rules; the resync period may differ), before Start:
// lookups and subscriptions answer from it at once, the resources it holds
// are Synced and Stale, and at Start each of their watches resumes from
// the snapshot's resourceVersion, listing only when the apiserver cannot
// resume it (then only the differences are applied, deletes included).
// Resources the snapshot lacks start as without one.
//
// The indexes answer when it returns; each resource's objects are then
// written in the background (about a second at 100,000 objects), reading
// data: do not change data after the call. Writes of the resource wait
// for that.
//
// A snapshot is untrusted: one that is damaged, of another format or of
// another config changes nothing and returns a *SnapshotError. It returns
// when the snapshot was written.
//
// With several clusters, each cluster's part of each resource is
// restored with its own resourceVersion, and checked against its own
// cluster's identity: a cluster whose identity changed drops its part
// alone and lists (cold), the others resume. The part of a cluster that
// the config no longer reads (for that resource) is not restored; a
// cluster that the snapshot lacks starts cold. A snapshot of one cluster
// is refused for a config that reads several, and the other way round:
// their object keys differ. With several clusters, each resource is built
// from its objects before RestoreSnapshot returns (a cluster's part is
// read from the objects behind a key), not answered from the snapshot's
// tables first.
func (e *Inspector) RestoreSnapshot(data []byte) (time.Time, error) {
	if e.started.Load() {
		return time.Time{}, errors.New("RestoreSnapshot after Start")
	}
	f, err := warmfile.Decode(data)
	if err != nil {
		reason := "corrupt"
		var se *warmfile.Error
		if errors.As(err, &se) {
			reason = se.Reason
		}
		return time.Time{}, &SnapshotError{reason, err}
	}
	v, _ := e.view()
	if v.plan == nil {
		return time.Time{}, errEmptyPlan
	}
	several := len(v.plan.Clusters) > 0
	switch {
	case several && f.Version != warmfile.VersionClusters:
		return time.Time{}, &SnapshotError{"config", errors.New("a snapshot of one cluster's data, and the config reads several clusters (clusters:)")}
	case !several && f.Version == warmfile.VersionClusters:
		return time.Time{}, &SnapshotError{"config", errors.New("a snapshot of several clusters' data, and the config reads one cluster (no clusters:)")}
	}
	if f.Config != v.plan.DataHash() {
		return time.Time{}, &SnapshotError{"config", errors.New("written for other resource entries (GVR, namespace, selectors, fields or index rules differ)")}
	}
	// Check everything before writing anything.
	todo, err := restoresOf(f, v, several)
	if err != nil {
		return time.Time{}, err
	}
	e.restoreIdentities(f, v, several)
	for _, t := range todo {
		t.load(f.WrittenAt)
	}
	return f.WrittenAt, nil
}

// restore is one resource of a snapshot, checked against the config.
type restore struct {
	r   *warmfile.Resource
	res *resource
	// parts: the watchers restored and what each resumes from: one of
	// no cluster, or one per cluster of the snapshot that the config
	// reads for the resource; partial: the snapshot holds parts of
	// clusters that are not restored.
	parts   []*follow.Watcher
	rvs     []warmfile.Part
	partial bool
}

// restoresOf checks each resource of snapshot f against the view's config
// (its indexes, their bounds, each part's resourceVersion), and returns
// what to restore, or why the snapshot cannot be used.
func restoresOf(f *warmfile.File, v *view, several bool) ([]restore, error) {
	var todo []restore
	var bounds error
	for i := range f.Resources {
		r := &f.Resources[i]
		res := v.byName[r.Name]
		if res == nil {
			return nil, &SnapshotError{"config", fmt.Errorf("resource %q is not in the config", r.Name)}
		}
		if slices.ContainsFunc(todo, func(t restore) bool { return t.res == res }) {
			return nil, &SnapshotError{"corrupt", fmt.Errorf("resource %q twice", r.Name)}
		}
		p := res.plan
		if len(r.Indexes) != len(p.Indexes) {
			return nil, &SnapshotError{"config", fmt.Errorf("resource %q: %d indexes, the config has %d", r.Name, len(r.Indexes), len(p.Indexes))}
		}
		for i, name := range r.Indexes {
			if name != p.Indexes[i].Name {
				return nil, &SnapshotError{"config", fmt.Errorf("resource %q: index %q where the config has %q", r.Name, name, p.Indexes[i].Name)}
			}
		}
		for i, ix := range p.Indexes {
			if r.MaxEntries[i] > ix.MaxEntries || r.MaxBytes[i] > ix.MaxBytes {
				// A snapshot written by this config never holds one: the
				// watcher leaves such an object out of the index.
				bounds = multierror.Append(bounds, fmt.Errorf("resource %q, index %q: an object with %d entries of %d bytes, over maxEntriesPerObject (%d entries, %d bytes)",
					r.Name, ix.Name, r.MaxEntries[i], r.MaxBytes[i], ix.MaxEntries, ix.MaxBytes))
			}
		}
		t := restore{r: r, res: res}
		parts := r.Parts
		if !several {
			parts = []warmfile.Part{{ResourceVersion: r.ResourceVersion, Relist: r.Relist, Objects: r.Objects}}
		}
		for _, part := range parts {
			if !part.Relist && (part.ResourceVersion == "" || part.ResourceVersion == "0") {
				// "0" would ask the apiserver for "any version": a watch from
				// it replays the current objects, never the deletes since.
				what := fmt.Sprintf("resource %q", r.Name)
				if several {
					what += fmt.Sprintf(", cluster %q", part.Cluster)
				}
				return nil, &SnapshotError{"corrupt", fmt.Errorf("%s: resourceVersion %q", what, part.ResourceVersion)}
			}
			i := slices.IndexFunc(res.parts, func(w *follow.Watcher) bool { return w.ClusterName == part.Cluster })
			if i < 0 {
				t.partial = true // a cluster the config no longer reads for the resource
				continue
			}
			t.parts, t.rvs = append(t.parts, res.parts[i]), append(t.rvs, part)
		}
		todo = append(todo, t)
	}
	if bounds != nil {
		return nil, &SnapshotError{"corrupt", bounds}
	}
	return todo, nil
}

// restoreIdentities keeps the identity of each cluster that snapshot f was
// written from, for each watch to check before it resumes.
func (e *Engine) restoreIdentities(f *warmfile.File, v *view, several bool) {
	if !several {
		e.ident.Mu.Lock()
		e.ident.Snapshot = strings.Clone(f.Cluster)
		e.ident.Mu.Unlock()
		return
	}
	for _, c := range f.Clusters {
		// The config's name: c's strings alias the snapshot's data,
		// which may be unmapped once loaded.
		i := slices.IndexFunc(v.plan.Clusters, func(pc compiled.Cluster) bool { return pc.Name == c.Name })
		if i < 0 {
			e.log.Info("the snapshot's part of a cluster that the config no longer reads is not restored", "clusterName", strings.Clone(c.Name))
			continue
		}
		id := e.identOf(v.plan.Clusters[i].Name)
		id.Mu.Lock()
		id.Snapshot = strings.Clone(c.Identity)
		id.Mu.Unlock()
	}
}

// load fills the resource's source from the snapshot and tells each
// restored watcher where it resumes from.
func (t restore) load(writtenAt time.Time) {
	if len(t.parts) == 0 {
		return
	}
	var keep func(key string) bool
	if t.partial {
		prefixes := make([]string, len(t.parts))
		for i, w := range t.parts {
			prefixes[i] = w.KeyPrefix
		}
		keep = func(key string) bool {
			return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(key, p) })
		}
	}
	loaded := restoreFrom(t.res.src, t.r, len(t.res.plan.Fields) > 0, keep, t.parts[0].Log)
	for i, w := range t.parts {
		part := t.rvs[i]
		w.Loaded = loaded
		rv := strings.Clone(part.ResourceVersion)
		w.Restored, w.RestoredRelist, w.ResumeRV, w.RestoredAt = true, part.Relist, rv, writtenAt
		if part.Relist {
			// An earlier definition's data: answered, stale, until a list.
			w.ResumeRV = ""
		}
		w.RV.Store(&rv)
		w.Count.Store(int64(part.Objects))
		w.Log.Info("restored from the snapshot", "objects", part.Objects, "resourceVersion", rv, "relist", part.Relist)
	}
}

// restoreFrom loads a resource of a snapshot into its source: its tables
// at once, its objects in the background (see indexer.Source.Load), and
// returns the channel that is closed once the source can be written.
// keep, when not nil, says which objects to restore: the tables, which
// hold every object's, are then not used, nor when the snapshot left
// them out, and the source is built from the objects at once. r's
// strings alias the snapshot's data, which stays unchanged: what the
// source keeps, it copies.
func restoreFrom(src *indexer.Source, r *warmfile.Resource, fields bool, keep func(key string) bool, log *slog.Logger) <-chan struct{} {
	var indexes []indexer.SavedIndex
	if keep == nil && !r.TablesLeftOut {
		indexes = make([]indexer.SavedIndex, len(r.Tables))
		for i := range r.Tables {
			t := &r.Tables[i]
			indexes[i] = indexer.SavedIndex{Keys: t.Keys, Each: t.Each}
		}
	}
	payloads := func(f func(key string, payload any)) {
		if !fields {
			return
		}
		r.EachObject(func(o warmfile.Object) {
			if o.HasPayload && (keep == nil || keep(o.Key)) {
				f(o.Key, strings.Clone(o.Payload))
			}
		})
	}
	objects := func() []indexer.Object {
		objs := make([]indexer.Object, 0, r.Objects)
		seen := make(map[string]struct{}, r.Objects)
		r.EachObject(func(o warmfile.Object) {
			if keep != nil && !keep(o.Key) {
				return
			}
			if _, dup := seen[o.Key]; dup {
				// A copy: the snapshot's data may be unmapped once loaded.
				log.Error("snapshot object twice: the first kept", "object", strings.Clone(o.Key))
				return
			}
			seen[o.Key] = struct{}{}
			obj := indexer.Object{Key: o.Key, Entries: o.Entries, Meta: o.Meta}
			if o.HasPayload && fields {
				obj.Payload = strings.Clone(o.Payload)
			}
			src.Prepare(&obj) // copies the key and the entries
			objs = append(objs, obj)
		})
		return objs
	}
	return src.Load(r.Strings, indexes, r.Objects, payloads, objects)
}

// Stale reports whether some resource answers from a snapshot and has not
// caught up with the apiserver yet.
func (e *Engine) Stale() bool {
	v, _ := e.view()
	return v.stale()
}

func (v *view) stale() bool {
	for _, w := range v.watchers {
		if w.Stale() {
			return true
		}
	}
	return false
}

// WaitForData blocks until every resource has data to answer with, from a
// complete list or from a snapshot, or ctx ends. It is WaitForSync for a
// caller that prefers stale answers to none: after a warm start it returns
// at once, while the data may be as old as the snapshot (see Stale and
// ResourceStatus.Stale); WaitForSync returns once every resource has
// caught up with the apiserver.
func (e *Engine) WaitForData(ctx context.Context) error {
	for {
		v, _ := e.view()
		var waiting *follow.Watcher
		for _, w := range v.watchers {
			if w.Required && !w.IsSynced() {
				waiting = w
				break
			}
		}
		if waiting == nil {
			return nil
		}
		select {
		case <-waiting.Synced:
		case <-ctx.Done():
			return fmt.Errorf("no data for %s: %w", waiting.Plan.Name, ctx.Err())
		}
	}
}

// StaleChanged returns a channel that is closed when Stale may have
// changed: a resource caught up with the apiserver (by a list, or by a
// watch resumed from the snapshot's resourceVersion), dropped a snapshot
// of another cluster, or a reload changed the resources. Ask Stale again
// then, and StaleChanged for the next change. A change stream uses it to
// tell its client at once that its answers are current.
func (e *Inspector) StaleChanged() <-chan struct{} {
	e.staleMu.Lock()
	defer e.staleMu.Unlock()
	if e.staleCh == nil {
		e.staleCh = make(chan struct{})
	}
	return e.staleCh
}

// staleMayHaveChanged closes the channel of StaleChanged.
func (e *Engine) staleMayHaveChanged() {
	e.staleMu.Lock()
	defer e.staleMu.Unlock()
	if e.staleCh != nil {
		close(e.staleCh)
		e.staleCh = nil
	}
}
