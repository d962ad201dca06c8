package sync

import (
	"context"
	"log/slog"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"
)

// A watch that broke resumes from the last resourceVersion it saw. That
// is sound only while the apiserver behind the address serves the same
// history. It may not: a cluster rebuilt behind the same address (etcd
// wiped, more written since than the resourceVersion the watch resumes
// from) accepts the watch and never sends the deletes of the objects it
// lost; an etcd restored from a backup goes back in time the same way.
// The answers would keep the old cluster's objects and look fresh.
//
// So the engine looks for another cluster behind the address three ways:
//
//   - every identityEvery (half of Options.StaleAfter, between 1 and
//     15 s: one small GET per cluster), it reads the cluster's identity,
//     the UID of namespace kube-system, from etcd, and compares it with
//     the one read before: an apiserver left running while its etcd is
//     replaced keeps its clients' watches open, and nothing fails;
//   - a watch whose events or bookmarks go back in resourceVersion (they
//     come in order) tells of another history at once;
//   - after trouble (a failed list or watch, or a watch the apiserver
//     ended before its timeout), before the next watch opens, the
//     watcher reads the identity again and asks the apiserver for its
//     resourceVersion (currentVersion): one older than the watch's means
//     etcd went back in time.
//
// A change marks every resource of the cluster stale (rebuilt), logs it
// and counts it (ResourceStatus.ClusterChanges). Each resource then lists
// from scratch, its part replaced whole, once the apiserver's cache knows
// the new cluster: the kube-system it serves from its cache
// (resourceVersion=0) has the UID etcd has. An apiserver left running
// while its etcd was replaced keeps serving the old cluster from its
// watch cache (its consistent reads compare revisions, and the new etcd's
// are lower), to every client: until it is restarted, a list would bring
// the ghosts back, so the cluster's answers stay stale, and the engine
// looks again every identityEvery.
//
// What no check can tell: an etcd restored from a backup and then written
// past the engine's resourceVersion before the engine asks (at its first
// watch attempt after the apiserver answers again, within the backoff of
// at most 10 s) keeps the kube-system UID and a resourceVersion that did
// not go back. Kubernetes asks that every client be restarted after such
// a restore; an engine restarted without its snapshot lists.

// identityEvery is how often each cluster's identity is read while
// nothing fails: half of staleAfter, between 1 and 15 s.
func identityEvery(staleAfter time.Duration) time.Duration {
	return min(max(staleAfter/2, time.Second), 15*time.Second)
}

// clusterChanged marks every resource of the cluster stale, and lists
// them from scratch once the apiserver's cache knows the new cluster.
func (e *Engine) clusterChanged(ctx context.Context, cluster, why string) {
	v, _ := e.view()
	n := 0
	for _, w := range v.watchers {
		if w.ClusterName == cluster {
			w.ClusterChanges.Add(1)
			w.Rebuilt.Store(true)
			w.RV.Store(nil) // not the cluster's data: a snapshot leaves it out
			w.NoteFresh()
			n++
		}
	}
	id := e.identOf(cluster)
	id.Settling.Lock() // after a look under way, which would clear it
	id.Pending.Store(true)
	id.Settling.Unlock()
	e.clusterLog(cluster).Warn("the cluster behind the address is not the one the answers came from: "+why+"; its answers are marked stale until each of its resources has listed from scratch",
		"resources", n)
	e.settleChange(ctx, cluster)
}

// settleChange lists every resource of a changed cluster from scratch
// once the apiserver's cache serves the kube-system that etcd has; until
// then it leaves them stale, to be looked at again by watchIdentities. A
// cluster whose identity cannot be read (RBAC) has no cache to compare:
// it lists at once.
func (e *Engine) settleChange(ctx context.Context, cluster string) {
	id := e.identOf(cluster)
	if !id.Pending.Load() {
		return
	}
	id.Settling.Lock() // one look at a time
	defer id.Settling.Unlock()
	if !id.Pending.Load() {
		return
	}
	log := e.clusterLog(cluster)
	inEtcd, cached, err := id.BothReadings(ctx)
	switch {
	case err != nil && !follow.Permanent(err):
		return // the apiserver cannot be asked: again later
	case err != nil:
		log.Info("the cluster's identity cannot be read, so nor whether the apiserver's cache knows the new cluster: each of its resources lists from scratch now", "error", err.Error())
	case cached != inEtcd || inEtcd == "":
		if !id.ToldStale.Swap(true) {
			log.Warn("the apiserver still serves the old cluster from its cache (restart an apiserver left running while its etcd was replaced): the cluster's answers stay stale until it serves the new one",
				"cachedUID", cached, "etcdUID", inEtcd)
		}
		return
	default:
		id.Mu.Lock()
		id.Known, id.ID, id.RereadAt = true, inEtcd, time.Now()
		id.Started++
		id.Landed = id.Started // readings under way are older
		id.Mu.Unlock()
		log.Info("the apiserver's cache serves what etcd holds: each of the cluster's resources lists from scratch", "uid", inEtcd)
	}
	id.ToldStale.Store(false)
	v, _ := e.view()
	for _, w := range v.watchers {
		if w.ClusterName == cluster {
			w.ListFromScratch()
		}
	}
	id.Pending.Store(false)
}

// clusterLog is the engine's logger, naming the cluster of a plan that
// reads several.
func (e *Engine) clusterLog(cluster string) *slog.Logger {
	if cluster == "" {
		return e.log
	}
	return e.log.With("clusterName", cluster)
}

// watchIdentities reads the identity of each cluster the engine watches
// every identityEvery until ctx ends: a cluster whose identity changed
// is relisted (see above), one that changed and whose apiserver's cache
// did not know it yet is looked at again. A reading that fails is left to
// the watches, which fail too, and check again after.
func (e *Engine) watchIdentities(ctx context.Context) {
	t := time.NewTicker(identityEvery(e.staleAfter))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		v, _ := e.view()
		seen := map[string]bool{}
		for _, w := range v.watchers {
			if seen[w.ClusterName] || w.Identity == nil || !w.IsSynced() {
				continue
			}
			seen[w.ClusterName] = true
			if w.Identity.Changing() {
				e.settleChange(ctx, w.ClusterName)
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			was, now, err := w.Identity.Reread(rctx, 0)
			cancel()
			if err == nil && was != now {
				e.clusterChanged(ctx, w.ClusterName, follow.IdentityWhy(was, now))
			}
		}
	}
}

// recovered wakes the cluster's other resources that have not been
// answered since their trouble began, once per outage of from: one of
// them was answered again, so the cluster is back, and its resources
// return together rather than each at the end of its own backoff, which
// the reflector's retries of a watch stretch to 30 s: out of their
// backoff, and those whose part dropAfter removed to list at once. A
// resource whose list is under way is left to it.
func (e *Engine) recovered(from *follow.Watcher) {
	v, _ := e.view()
	for _, w := range v.watchers {
		if w == from || w.ClusterName != from.ClusterName || w.Listing.Load() {
			continue
		}
		w.Mu.Lock()
		since := w.FailingSince
		w.Mu.Unlock()
		if since.IsZero() || w.LastContact().After(since) {
			continue
		}
		select {
		case w.Wake <- struct{}{}: // out of its backoff
		default:
		}
		// One whose part dropAfter removed lists anyway: at once, rather
		// than at the end of the reflector's retries. Another keeps its
		// part (stale) meanwhile, and resumes its watch as it would.
		if f := w.RelistNow.Load(); f != nil && w.Phase().Dropped() {
			(*f)()
		}
	}
}
