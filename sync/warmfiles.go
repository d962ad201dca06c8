package sync

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"
)

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
		writtenAt, err = e.Inspect().RestoreSnapshot(data)
		// The restored sources read data until they can be written.
		v, _ := e.view()
		var loading []<-chan struct{}
		for _, w := range v.watchers {
			if w.Loaded != nil {
				loading = append(loading, w.Loaded)
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
				if slices.ContainsFunc(v.watchers, func(w *follow.Watcher) bool { return w.ClusterName == c.Name && w.Restored }) {
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
	if objects, err = e.Inspect().WriteSnapshot(bw); err != nil {
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
