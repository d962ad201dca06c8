package sync

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/internal/warmfile"
)

// SnapshotFile is the name of the snapshot in Options.SnapshotDir.
const SnapshotFile = "snapshot"

// DefaultSnapshotInterval is the default of Options.SnapshotInterval.
const DefaultSnapshotInterval = time.Minute

// SnapshotStatus is the state of an engine's snapshots.
type SnapshotStatus struct {
	// Load is how the engine started: "warm" (from a snapshot), "cold"
	// (LoadReason says why), or "" when no snapshot was asked for. With
	// several clusters it is warm while some cluster's part is (see
	// Clusters): cold "missing" when the snapshot has none of theirs,
	// cold "cluster" once every part restored was dropped.
	Load       string `json:"load,omitempty"`
	LoadReason string `json:"loadReason,omitempty"`
	// WrittenAt is when the newest snapshot written or loaded was
	// written: its data is that old at most. Zero when there is none.
	WrittenAt time.Time `json:"writtenAt,omitzero"`
	// The last write: how long it took, its size, and its error if it
	// failed.
	Writes        int64         `json:"writes"`
	WriteErrors   int64         `json:"writeErrors"`
	WriteDuration time.Duration `json:"writeDuration"`
	Bytes         int64         `json:"bytes"`
	Objects       int           `json:"objects"`
	WriteError    string        `json:"writeError,omitempty"`
	// Clusters, of a config that reads several, is how each cluster's
	// part started, in config order; nil otherwise.
	Clusters []ClusterLoad `json:"clusters,omitempty"`
}

// ClusterLoad is how one cluster's part of the data started, of a config
// that reads several clusters: Load is "warm" (its part restored from
// the snapshot) or "cold"; LoadReason says why it is cold: "missing" (the
// snapshot has no part of the cluster: a cluster added since, or one that
// had not synced), "cluster" (the snapshot's part came from another
// cluster: its identity changed; the part was dropped), or the reason of
// the whole snapshot's cold start.
type ClusterLoad struct {
	Name       string `json:"name"`
	Load       string `json:"load"`
	LoadReason string `json:"loadReason,omitempty"`
}

// setCluster records how a cluster's part started.
// Once no cluster's part is warm, the whole start is cold ("cluster"),
// as a start of one cluster whose identity changed is.
func (st *SnapshotStatus) setCluster(name, load, reason string) {
	i := slices.IndexFunc(st.Clusters, func(c ClusterLoad) bool { return c.Name == name })
	if i < 0 {
		st.Clusters = append(st.Clusters, ClusterLoad{Name: name})
		i = len(st.Clusters) - 1
	}
	st.Clusters[i].Load, st.Clusters[i].LoadReason = load, reason
	if st.Load == "warm" && !slices.ContainsFunc(st.Clusters, func(c ClusterLoad) bool { return c.Load == "warm" }) {
		st.Load, st.LoadReason, st.WrittenAt = "cold", "cluster", time.Time{}
	}
}

// warmFiles is the state of the engine's warm-start files (--snapshot-dir).
type warmFiles struct {
	dir      string
	interval time.Duration
	mu       gosync.Mutex // one write at a time; guards status
	status   SnapshotStatus
}

// SnapshotStatus returns the state of the engine's snapshots.
func (e *Engine) SnapshotStatus() SnapshotStatus {
	e.warm.mu.Lock()
	defer e.warm.mu.Unlock()
	st := e.warm.status
	st.Clusters = slices.Clone(st.Clusters)
	return st
}

// WriteSnapshot writes what the indexes hold to out, with each resource's
// resourceVersion and the cluster's identity, for RestoreSnapshot: every
// resource that has data to answer with. One that a reload restarted and
// that has not listed since is written as it answers, from its previous
// definition, marked to be listed rather than resumed when its data is
// not the current definition's: a snapshot never knows less than the
// one it replaces, even when a reload comes during an outage. Those still
// waiting for their first list are left out. It runs beside lookups and
// writes, each resource's writer stopped only while its object table is
// copied. It returns how many objects it wrote.
//
// With several clusters, each resource is written with each cluster's
// part (its objects, the resourceVersion it resumes from) and the
// snapshot records each cluster's identity: a part is restored, and
// checked, on its own (see RestoreSnapshot).
func (e *Engine) WriteSnapshot(out io.Writer) (int, error) {
	v, _ := e.view()
	if v.plan == nil {
		return 0, errEmptyPlan
	}
	if len(v.plan.Clusters) > 0 {
		return e.writeClusters(out, v)
	}
	// The identity first: the data written after it is of that cluster
	// (checkCluster drops another cluster's before it tells).
	cluster := e.clusterForSnapshot("")
	verified := e.verified("")
	type resource struct {
		w      *watcher
		rv     string
		relist bool
	}
	var rs []resource
	var ws []*watcher
	for _, w := range v.watchers {
		if rv, relist, ok := w.forSnapshot(verified); ok {
			rs = append(rs, resource{w, rv, relist})
			ws = append(ws, w)
		}
	}
	if len(rs) == 0 {
		return 0, ErrNothingToSnapshot
	}
	enc := warmfile.NewEncoder(out, v.plan.DataHash(), cluster, snapshotAge(ws), len(rs))
	total := 0
	for _, r := range rs {
		total += writeResource(enc, r.w.src, r.w.plan, nil, func(names, strs []string, _ bool) {
			enc.Resource(r.w.plan.Name, r.rv, r.relist, names, strs)
		})
	}
	return total, enc.Close()
}

// forSnapshot returns what a snapshot records of the watcher's data: the
// resourceVersion it is as of, and whether it must be listed rather than
// resumed; ok false when it has no data to write (not synced yet, or
// dropped). verified: the snapshot's cluster was found to be the
// watcher's (see Engine.verified).
func (w *watcher) forSnapshot(verified bool) (rv string, relist, ok bool) {
	// The resourceVersion first: the objects exported after it are as
	// of it or newer, and a watch that resumes from it misses nothing
	// (events it repeats change nothing).
	rv = w.resourceVersion()
	// Objects whose rule fails are not in the snapshot's data: a
	// resource with any is listed at the next start, so that they
	// are found failing again (a resumed watch would not see them).
	// Data read through a connection not listed through yet may be
	// another cluster's (see rotate): listed too.
	failing := w.failing.any() || w.reconnected.Load()
	switch c := w.carried; {
	case rv == "":
	case w.listed1():
		return rv, failing, true
	case w.warm():
		// Data of a snapshot whose cluster was not found to be this
		// one: listed, never resumed, at the next start.
		return rv, w.restoredRelist || !verified || failing, true
	case c != nil && !w.dropped.Load():
		return c.rv, c.relist || c.unverified && !verified || failing, true
	}
	return "", false, false
}

// snapshotAge returns when a snapshot of the data of ws written now is
// as of: now, or when the oldest data it holds was written, that of a
// resource that still answers from the snapshot it was restored from.
func snapshotAge(ws []*watcher) time.Time {
	at := time.Now()
	for _, w := range ws {
		if w.stale() && !w.restoredAt.IsZero() && w.restoredAt.Before(at) {
			at = w.restoredAt
		}
	}
	return at
}

// writeClusters is WriteSnapshot for a plan that reads several clusters:
// for each resource, the parts of the clusters that have data to write,
// each with its resourceVersion; for each cluster, its identity.
func (e *Engine) writeClusters(out io.Writer, v *view) (int, error) {
	// The identities first: the data written after them is of those
	// clusters (checkCluster drops another cluster's before it tells).
	ids := map[string]string{}
	verified := map[string]bool{}
	for _, c := range v.plan.Clusters {
		ids[c.Name], verified[c.Name] = e.clusterForSnapshot(c.Name), e.verified(c.Name)
	}
	type entry struct {
		res   *resource
		parts []warmfile.Part
		ws    []*watcher
	}
	var rs []entry
	var all []*watcher
	written := map[string]bool{}
	for _, r := range v.plan.Resources {
		res := v.byName[r.Name]
		if res == nil {
			continue
		}
		one := entry{res: res}
		for _, w := range res.parts {
			if rv, relist, ok := w.forSnapshot(verified[w.clusterName]); ok {
				one.parts = append(one.parts, warmfile.Part{Cluster: w.clusterName, ResourceVersion: rv, Relist: relist})
				one.ws = append(one.ws, w)
				all = append(all, w)
				written[w.clusterName] = true
			}
		}
		if len(one.parts) > 0 {
			rs = append(rs, one)
		}
	}
	if len(rs) == 0 {
		return 0, ErrNothingToSnapshot
	}
	var clusters []warmfile.Cluster
	for _, c := range v.plan.Clusters {
		if written[c.Name] {
			clusters = append(clusters, warmfile.Cluster{Name: c.Name, Identity: ids[c.Name]})
		}
	}
	enc := warmfile.NewClustersEncoder(out, v.plan.DataHash(), clusters, snapshotAge(all), len(rs))
	total := 0
	for _, r := range rs {
		// Only the objects of the parts written: a cluster without data
		// to write (not synced yet, dropped) may hold some meanwhile.
		var keep func(string) bool
		if len(r.parts) < len(r.res.parts) {
			prefixes := make([]string, len(r.ws))
			for i, w := range r.ws {
				prefixes[i] = w.keyPrefix
			}
			keep = func(key string) bool {
				return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(key, p) })
			}
		}
		total += writeResource(enc, r.res.src, r.res.plan, keep, func(names, strs []string, tables bool) {
			enc.ClusterResource(r.res.plan.Name, r.parts, tables, names, strs)
		})
	}
	return total, enc.Close()
}

// writeResource writes one resource of plan from src: its tables (keys
// with their values and object keys as numbers in a table of strings,
// each once), then its objects; start begins the resource. Data carried
// over a reload is in the current definition's layout too: the store's
// Reconfigure kept each index by name, and laid out the objects' entries
// anew. keep, when not nil, says which objects to write: when it leaves
// any out, the tables (which hold every object's entries) are left out
// too, and the resource is built from its objects when restored. It
// returns the number of objects written.
func writeResource(enc *warmfile.Encoder, src *indexer.Source, plan *compiled.Resource, keep func(key string) bool, start func(names, strs []string, tables bool)) int {
	img := src.Image()
	names := make([]string, len(plan.Indexes))
	for i, ix := range plan.Indexes {
		names[i] = ix.Name
	}
	if img.Indexes() != len(names) {
		names = names[:0] // removed by a reload meanwhile: nothing to write
	}
	tables := true
	if keep != nil {
		img.Keys(func(key string) {
			if !keep(key) {
				tables = false
			}
		})
	}
	ids := map[string]uint32{}
	var strs []string
	intern := func(s string) {
		if _, ok := ids[s]; !ok {
			ids[s] = uint32(len(strs))
			strs = append(strs, s)
		}
	}
	for i := range names {
		if !tables {
			break
		}
		img.Table(i, func(_ string, values, objects []string) {
			for _, v := range values {
				intern(v)
			}
			for _, o := range objects {
				intern(o)
			}
		})
	}
	start(names, strs, tables)
	var vids, oids []uint32
	for i := range names {
		if !tables {
			break
		}
		enc.Table(img.WithObjects())
		img.Table(i, func(key string, values, objects []string) {
			vids, oids = vids[:0], oids[:0]
			for _, v := range values {
				vids = append(vids, ids[v])
			}
			for _, o := range objects {
				oids = append(oids, ids[o])
			}
			enc.Key(key, vids, oids)
		})
	}
	n := 0
	img.Objects(func(key string, meta indexer.Meta, entries [][]indexer.Entry, payload any) {
		if keep != nil && !keep(key) {
			return
		}
		p, ok := payload.(string)
		enc.Object(key, p, ok, meta, entries[:min(len(entries), len(names))])
		n++
	})
	return n
}

// ErrNothingToSnapshot: no resource has synced yet, WriteSnapshot wrote
// nothing.
var ErrNothingToSnapshot = errors.New("no resource has synced yet: nothing to snapshot")

// SnapshotError is why a snapshot was not used: Reason is one word (for
// metrics): missing, truncated, checksum, format, corrupt, config, or
// unreadable.
type SnapshotError struct {
	Reason string
	Err    error
}

func (e *SnapshotError) Error() string { return e.Err.Error() }
func (e *SnapshotError) Unwrap() error { return e.Err }

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
func (e *Engine) RestoreSnapshot(data []byte) (time.Time, error) {
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
	type restore struct {
		r   *warmfile.Resource
		res *resource
		// parts: the watchers restored and what each resumes from: one of
		// no cluster, or one per cluster of the snapshot that the config
		// reads for the resource; partial: the snapshot holds parts of
		// clusters that are not restored.
		parts   []*watcher
		rvs     []warmfile.Part
		partial bool
	}
	var todo []restore
	var bounds error
	for i := range f.Resources {
		r := &f.Resources[i]
		res := v.byName[r.Name]
		if res == nil {
			return time.Time{}, &SnapshotError{"config", fmt.Errorf("resource %q is not in the config", r.Name)}
		}
		if slices.ContainsFunc(todo, func(t restore) bool { return t.res == res }) {
			return time.Time{}, &SnapshotError{"corrupt", fmt.Errorf("resource %q twice", r.Name)}
		}
		p := res.plan
		if len(r.Indexes) != len(p.Indexes) {
			return time.Time{}, &SnapshotError{"config", fmt.Errorf("resource %q: %d indexes, the config has %d", r.Name, len(r.Indexes), len(p.Indexes))}
		}
		for i, name := range r.Indexes {
			if name != p.Indexes[i].Name {
				return time.Time{}, &SnapshotError{"config", fmt.Errorf("resource %q: index %q where the config has %q", r.Name, name, p.Indexes[i].Name)}
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
				return time.Time{}, &SnapshotError{"corrupt", fmt.Errorf("%s: resourceVersion %q", what, part.ResourceVersion)}
			}
			i := slices.IndexFunc(res.parts, func(w *watcher) bool { return w.clusterName == part.Cluster })
			if i < 0 {
				t.partial = true // a cluster the config no longer reads for the resource
				continue
			}
			t.parts, t.rvs = append(t.parts, res.parts[i]), append(t.rvs, part)
		}
		todo = append(todo, t)
	}
	if bounds != nil {
		return time.Time{}, &SnapshotError{"corrupt", bounds}
	}
	if several {
		for _, c := range f.Clusters {
			// The config's name: c's strings alias the snapshot's data,
			// which may be unmapped once loaded.
			i := slices.IndexFunc(v.plan.Clusters, func(pc compiled.Cluster) bool { return pc.Name == c.Name })
			if i < 0 {
				e.log.Info("the snapshot's part of a cluster that the config no longer reads is not restored", "clusterName", strings.Clone(c.Name))
				continue
			}
			id := e.identOf(v.plan.Clusters[i].Name)
			id.mu.Lock()
			id.snapshot = strings.Clone(c.Identity)
			id.mu.Unlock()
		}
	} else {
		e.ident.mu.Lock()
		e.ident.snapshot = strings.Clone(f.Cluster)
		e.ident.mu.Unlock()
	}
	for _, t := range todo {
		if len(t.parts) == 0 {
			continue
		}
		var keep func(key string) bool
		if t.partial {
			prefixes := make([]string, len(t.parts))
			for i, w := range t.parts {
				prefixes[i] = w.keyPrefix
			}
			keep = func(key string) bool {
				return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(key, p) })
			}
		}
		loaded := restoreFrom(t.res.src, t.r, len(t.res.plan.Fields) > 0, keep, t.parts[0].log)
		for i, w := range t.parts {
			part := t.rvs[i]
			w.loaded = loaded
			rv := strings.Clone(part.ResourceVersion)
			w.restored, w.restoredRelist, w.resumeRV, w.restoredAt = true, part.Relist, rv, f.WrittenAt
			if part.Relist {
				// An earlier definition's data: answered, stale, until a list.
				w.resumeRV = ""
			}
			w.rv.Store(&rv)
			w.count.Store(int64(part.Objects))
			w.log.Info("restored from the snapshot", "objects", part.Objects, "resourceVersion", rv, "relist", part.Relist)
		}
	}
	return f.WrittenAt, nil
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

// loadWarmFile restores the snapshot of Options.SnapshotDir, if there is
// one that fits, and records how.
func (e *Engine) loadWarmFile() {
	path := filepath.Join(e.warm.dir, SnapshotFile)
	e.removeTemporaries()
	start := time.Now()
	outcome, reason := "warm", ""
	var writtenAt time.Time
	data, release, err := mapFile(path)
	read := time.Since(start)
	if err == nil {
		writtenAt, err = e.RestoreSnapshot(data)
		// The restored sources read data until they can be written.
		v, _ := e.view()
		var loading []<-chan struct{}
		for _, w := range v.watchers {
			if w.loaded != nil {
				loading = append(loading, w.loaded)
			}
		}
		go func() {
			for _, ch := range loading {
				<-ch
			}
			release()
		}()
	} else if errors.Is(err, fs.ErrNotExist) {
		err = &SnapshotError{"missing", fmt.Errorf("no snapshot at %s", path)}
	} else {
		err = &SnapshotError{"unreadable", err}
	}
	if err != nil {
		outcome, reason = "cold", "corrupt"
		var se *SnapshotError
		if errors.As(err, &se) {
			reason = se.Reason
		}
		// No snapshot is what a first start finds: normal, so INFO; one
		// that cannot be used is worth a WARN.
		if reason == "missing" {
			e.log.Info("no snapshot yet: cold start (a first start; snapshots are written from now on)", "path", path)
		} else {
			e.log.Warn("snapshot ignored: cold start", "path", path, "reason", reason, "error", err.Error())
		}
	} else {
		e.log.Info("warm start from the snapshot", "path", path, "bytes", len(data), "writtenAt", writtenAt.UTC().Format(time.RFC3339),
			"age", time.Since(writtenAt).Round(time.Millisecond).String(), "took", time.Since(start).Round(time.Microsecond).String(),
			"read", read.Round(time.Microsecond).String())
	}
	// Each cluster's part, of a config that reads several: warm when
	// restored, cold when the snapshot has none of it.
	var clusters []ClusterLoad
	if v, _ := e.view(); v.plan != nil && len(v.plan.Clusters) > 0 {
		for _, c := range v.plan.Clusters {
			cl := ClusterLoad{Name: c.Name, Load: "cold", LoadReason: reason}
			if outcome == "warm" {
				cl.LoadReason = "missing"
				if slices.ContainsFunc(v.watchers, func(w *watcher) bool { return w.clusterName == c.Name && w.restored }) {
					cl.Load, cl.LoadReason = "warm", ""
				} else {
					e.log.Info("the snapshot has no part of the cluster: it starts cold", "clusterName", c.Name)
				}
			}
			clusters = append(clusters, cl)
		}
		if outcome == "warm" && !slices.ContainsFunc(clusters, func(c ClusterLoad) bool { return c.Load == "warm" }) {
			// A snapshot of none of the clusters the config reads.
			outcome, reason, writtenAt = "cold", "missing", time.Time{}
		}
	}
	e.warm.mu.Lock()
	e.warm.status.Load, e.warm.status.LoadReason = outcome, reason
	e.warm.status.Clusters = clusters
	if !writtenAt.IsZero() {
		e.warm.status.WrittenAt = writtenAt
	}
	e.warm.mu.Unlock()
}

// removeTemporaries removes the temporary files that writes killed
// midway left in Options.SnapshotDir (the folder is the engine's alone).
func (e *Engine) removeTemporaries() {
	tmps, _ := filepath.Glob(filepath.Join(e.warm.dir, warmFileTemp))
	for _, p := range tmps {
		if err := os.Remove(p); err != nil {
			e.log.Warn("cannot remove a snapshot's temporary file", "path", p, "error", err.Error())
			continue
		}
		e.log.Info("removed the temporary file of an unfinished snapshot write", "path", p)
	}
}

// warmFileTemp is the pattern of the temporary files of snapshot writes.
const warmFileTemp = ".snapshot-*"

// writeWarmFile writes a snapshot to Options.SnapshotDir atomically: a
// temporary file in the same folder, synced, renamed over the last one.
func (e *Engine) writeWarmFile() error {
	e.warm.mu.Lock()
	defer e.warm.mu.Unlock()
	start := time.Now()
	n, size, err := e.writeWarmFileTo(e.warm.dir)
	st := &e.warm.status
	if errors.Is(err, ErrNothingToSnapshot) {
		e.log.Debug("no snapshot written: no resource has synced yet")
		return err // the last snapshot, if any, stays
	}
	if err != nil {
		st.WriteErrors++
		st.WriteError = err.Error()
		e.log.Warn("snapshot not written", "dir", e.warm.dir, "error", err.Error())
		return err
	}
	st.Writes++
	st.WriteError = ""
	st.WrittenAt, st.WriteDuration, st.Bytes, st.Objects = start, time.Since(start), size, n
	e.log.Debug("snapshot written", "objects", n, "bytes", size, "took", st.WriteDuration.String())
	return nil
}

func (e *Engine) writeWarmFileTo(dir string) (objects int, size int64, err error) {
	tmp, err := os.CreateTemp(dir, warmFileTemp) // mode 0600
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 256<<10)
	if objects, err = e.WriteSnapshot(bw); err != nil {
		return 0, 0, err
	}
	if err = bw.Flush(); err != nil {
		return 0, 0, err
	}
	if err = tmp.Sync(); err != nil {
		return 0, 0, err
	}
	st, err := tmp.Stat()
	if err != nil {
		return 0, 0, err
	}
	if err = tmp.Close(); err != nil {
		return 0, 0, err
	}
	if err = os.Rename(tmp.Name(), filepath.Join(dir, SnapshotFile)); err != nil {
		return 0, 0, err
	}
	// The rename is durable once the folder is synced.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return objects, st.Size(), nil
}

// writeWarmFiles writes a snapshot every interval until ctx ends; Start
// writes the last one once the watches have stopped.
func (e *Engine) writeWarmFiles(ctx context.Context) {
	t := time.NewTicker(e.warm.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = e.writeWarmFile()
		}
	}
}

// Stale reports whether some resource answers from a snapshot and has not
// caught up with the apiserver yet.
func (e *Engine) Stale() bool {
	v, _ := e.view()
	return v.stale()
}

func (v *view) stale() bool {
	for _, w := range v.watchers {
		if w.stale() {
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
		var waiting *watcher
		for _, w := range v.watchers {
			if w.required && !w.isSynced() {
				waiting = w
				break
			}
		}
		if waiting == nil {
			return nil
		}
		select {
		case <-waiting.synced:
		case <-ctx.Done():
			return fmt.Errorf("no data for %s: %w", waiting.plan.Name, ctx.Err())
		}
	}
}

// StaleChanged returns a channel that is closed when Stale may have
// changed: a resource caught up with the apiserver (by a list, or by a
// watch resumed from the snapshot's resourceVersion), dropped a snapshot
// of another cluster, or a reload changed the resources. Ask Stale again
// then, and StaleChanged for the next change. A change stream uses it to
// tell its client at once that its answers are current.
func (e *Engine) StaleChanged() <-chan struct{} {
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
