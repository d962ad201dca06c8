package sync

import (
	"io"
	"slices"
	"strings"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/internal/warmfile"
)

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
func (e *Inspector) WriteSnapshot(out io.Writer) (int, error) {
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
		w      *follow.Watcher
		rv     string
		relist bool
	}
	var rs []resource
	var ws []*follow.Watcher
	for _, w := range v.watchers {
		if rv, relist, ok := w.ForSnapshot(verified); ok {
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
		total += writeResource(enc, r.w.Src, r.w.Plan, nil, func(names, strs []string, _ bool) {
			enc.Resource(r.w.Plan.Name, r.rv, r.relist, names, strs)
		})
	}
	return total, enc.Close()
}

// snapshotAge returns when a snapshot of the data of ws written now is
// as of: now, or when the oldest data it holds was written, that of a
// resource that still answers from the snapshot it was restored from.
func snapshotAge(ws []*follow.Watcher) time.Time {
	at := time.Now()
	for _, w := range ws {
		if w.Stale() && !w.RestoredAt.IsZero() && w.RestoredAt.Before(at) {
			at = w.RestoredAt
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
		ws    []*follow.Watcher
	}
	var rs []entry
	var all []*follow.Watcher
	written := map[string]bool{}
	for _, r := range v.plan.Resources {
		res := v.byName[r.Name]
		if res == nil {
			continue
		}
		one := entry{res: res}
		for _, w := range res.parts {
			if rv, relist, ok := w.ForSnapshot(verified[w.ClusterName]); ok {
				one.parts = append(one.parts, warmfile.Part{Cluster: w.ClusterName, ResourceVersion: rv, Relist: relist})
				one.ws = append(one.ws, w)
				all = append(all, w)
				written[w.ClusterName] = true
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
				prefixes[i] = w.KeyPrefix
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
