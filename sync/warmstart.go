package sync

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/iidp/metasync/indexer"
	"github.com/iidp/metasync/internal/warmfile"
)

// SnapshotFile is the name of the snapshot in Options.SnapshotDir.
const SnapshotFile = "snapshot"

// DefaultSnapshotInterval is the default of Options.SnapshotInterval.
const DefaultSnapshotInterval = time.Minute

// SnapshotStatus is the state of an engine's snapshots.
type SnapshotStatus struct {
	// Load is how the engine started: "warm" (from a snapshot), "cold"
	// (LoadReason says why), or "" when no snapshot was asked for.
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
	return e.warm.status
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
func (e *Engine) WriteSnapshot(out io.Writer) (int, error) {
	v, _ := e.view()
	if v.plan == nil {
		return 0, errEmptyPlan
	}
	// The identity first: the data written after it is of that cluster
	// (checkCluster drops another cluster's before it tells).
	cluster := e.clusterForSnapshot()
	verified := e.verified()
	type resource struct {
		w      *watcher
		rv     string
		relist bool
	}
	var rs []resource
	for _, w := range v.watchers {
		// The resourceVersion first: the objects exported after it are as
		// of it or newer, and a watch that resumes from it misses nothing
		// (events it repeats change nothing).
		rv := w.resourceVersion()
		// Objects whose rule fails are not in the snapshot's data: a
		// resource with any is listed at the next start, so that they
		// are found failing again (a resumed watch would not see them).
		failing := w.failing.any()
		switch c := w.carried; {
		case rv == "":
		case w.listed1():
			rs = append(rs, resource{w, rv, failing})
		case w.warm():
			// Data of a snapshot whose cluster was not found to be this
			// one: listed, never resumed, at the next start.
			rs = append(rs, resource{w, rv, w.restoredRelist || !verified || failing})
		case c != nil && !w.dropped.Load():
			rs = append(rs, resource{w, c.rv, c.relist || c.unverified && !verified || failing})
		}
	}
	if len(rs) == 0 {
		return 0, ErrNothingToSnapshot
	}
	// The snapshot is as old as its oldest data: that of a resource that
	// still answers from the snapshot it was restored from.
	at := time.Now()
	for _, r := range rs {
		if r.w.stale() && !r.w.restoredAt.IsZero() && r.w.restoredAt.Before(at) {
			at = r.w.restoredAt
		}
	}
	enc := warmfile.NewEncoder(out, v.plan.DataHash(), cluster, at, len(rs))
	total := 0
	for _, r := range rs {
		total += writeResource(enc, r.w, r.rv, r.relist)
	}
	return total, enc.Close()
}

// writeResource writes one resource: its tables (keys with their values
// and object keys as numbers in a table of strings, each once), then its
// objects. Data carried over a reload is in the current definition's
// layout too: the store's Reconfigure kept each index by name, and laid
// out the objects' entries anew. It returns the number of objects.
func writeResource(enc *warmfile.Encoder, w *watcher, rv string, relist bool) int {
	img := w.src.Image()
	names := make([]string, len(w.plan.Indexes))
	for i, ix := range w.plan.Indexes {
		names[i] = ix.Name
	}
	if img.Indexes() != len(names) {
		names = names[:0] // removed by a reload meanwhile: nothing to write
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
		img.Table(i, func(_ string, values, objects []string) {
			for _, v := range values {
				intern(v)
			}
			for _, o := range objects {
				intern(o)
			}
		})
	}
	enc.Resource(w.plan.Name, rv, relist, names, strs)
	var vids, oids []uint32
	for i := range names {
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
	return img.Objects(func(key string, meta indexer.Meta, entries [][]indexer.Entry, payload any) {
		p, ok := payload.(string)
		enc.Object(key, p, ok, meta, entries[:min(len(entries), len(names))])
	})
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
	if f.Config != v.plan.DataHash() {
		return time.Time{}, &SnapshotError{"config", errors.New("written for other resource entries (GVR, namespace, selectors, fields or index rules differ)")}
	}
	// Check everything before writing anything.
	var todo []*watcher
	var bounds error
	for i := range f.Resources {
		r := &f.Resources[i]
		res := v.byName[r.Name]
		if res == nil {
			return time.Time{}, &SnapshotError{"config", fmt.Errorf("resource %q is not in the config", r.Name)}
		}
		w := res.lead() // a snapshot is of a plan without clusters
		if len(r.Indexes) != len(w.plan.Indexes) {
			return time.Time{}, &SnapshotError{"config", fmt.Errorf("resource %q: %d indexes, the config has %d", r.Name, len(r.Indexes), len(w.plan.Indexes))}
		}
		for i, name := range r.Indexes {
			if name != w.plan.Indexes[i].Name {
				return time.Time{}, &SnapshotError{"config", fmt.Errorf("resource %q: index %q where the config has %q", r.Name, name, w.plan.Indexes[i].Name)}
			}
		}
		for i, ix := range w.plan.Indexes {
			if r.MaxEntries[i] > ix.MaxEntries || r.MaxBytes[i] > ix.MaxBytes {
				// A snapshot written by this config never holds one: the
				// watcher leaves such an object out of the index.
				bounds = multierror.Append(bounds, fmt.Errorf("resource %q, index %q: an object with %d entries of %d bytes, over maxEntriesPerObject (%d entries, %d bytes)",
					r.Name, ix.Name, r.MaxEntries[i], r.MaxBytes[i], ix.MaxEntries, ix.MaxBytes))
			}
		}
		if !r.Relist && (r.ResourceVersion == "" || r.ResourceVersion == "0") {
			// "0" would ask the apiserver for "any version": a watch from
			// it replays the current objects, never the deletes since.
			return time.Time{}, &SnapshotError{"corrupt", fmt.Errorf("resource %q: resourceVersion %q", r.Name, r.ResourceVersion)}
		}
		if slices.Contains(todo, w) {
			return time.Time{}, &SnapshotError{"corrupt", fmt.Errorf("resource %q twice", r.Name)}
		}
		todo = append(todo, w)
	}
	if bounds != nil {
		return time.Time{}, &SnapshotError{"corrupt", bounds}
	}
	e.ident.mu.Lock()
	e.ident.snapshot = strings.Clone(f.Cluster)
	e.ident.mu.Unlock()
	for i, w := range todo {
		r := &f.Resources[i]
		w.restoreFrom(r, len(w.plan.Fields) > 0)
		rv := strings.Clone(r.ResourceVersion)
		w.restored, w.restoredRelist, w.resumeRV, w.restoredAt = true, r.Relist, rv, f.WrittenAt
		if r.Relist {
			// An earlier definition's data: answered, stale, until a list.
			w.resumeRV = ""
		}
		w.rv.Store(&rv)
		w.log.Info("restored from the snapshot", "objects", r.Objects, "resourceVersion", rv, "relist", r.Relist)
	}
	return f.WrittenAt, nil
}

// restoreFrom loads a resource of a snapshot into the watcher's source:
// its tables at once, its objects in the background (see
// indexer.Source.Load). r's strings alias the snapshot's data, which
// stays unchanged: what the source keeps, it copies.
func (w *watcher) restoreFrom(r *warmfile.Resource, fields bool) {
	indexes := make([]indexer.SavedIndex, len(r.Tables))
	for i := range r.Tables {
		t := &r.Tables[i]
		indexes[i] = indexer.SavedIndex{Keys: t.Keys, Each: t.Each}
	}
	payloads := func(f func(key string, payload any)) {
		if !fields {
			return
		}
		r.EachObject(func(o warmfile.Object) {
			if o.HasPayload {
				f(o.Key, strings.Clone(o.Payload))
			}
		})
	}
	objects := func() []indexer.Object {
		objs := make([]indexer.Object, 0, r.Objects)
		seen := make(map[string]struct{}, r.Objects)
		r.EachObject(func(o warmfile.Object) {
			if _, dup := seen[o.Key]; dup {
				// A copy: the snapshot's data may be unmapped once loaded.
				w.log.Error("snapshot object twice: the first kept", "object", strings.Clone(o.Key))
				return
			}
			seen[o.Key] = struct{}{}
			obj := indexer.Object{Key: o.Key, Entries: o.Entries, Meta: o.Meta}
			if o.HasPayload && fields {
				obj.Payload = strings.Clone(o.Payload)
			}
			w.src.Prepare(&obj) // copies the key and the entries
			objs = append(objs, obj)
		})
		return objs
	}
	w.loaded = w.src.Load(r.Strings, indexes, r.Objects, payloads, objects)
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
	e.warm.mu.Lock()
	e.warm.status.Load, e.warm.status.LoadReason = outcome, reason
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
