package sync

import (
	"context"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"
)

// A snapshot records the cluster its data came from: the UID of the
// cluster's kube-system namespace, the usual cluster ID (two clusters
// cannot share it; a namespace that is deleted and created again gets a
// new one, and the snapshot then counts as another cluster's, which costs
// one list). Before a restored resource resumes its watch, the engine
// reads the UID (one GET) and compares:
//
//   - the same: resume;
//   - another: the snapshot is another cluster's. Its data is cleared from
//     every resource at once, before anything else is written or
//     snapshotted, and the engine starts cold (SnapshotStatus: "cold",
//     reason "cluster");
//   - unknown (the snapshot has none, or the UID cannot be read: RBAC
//     forbids it, say): the data is not trusted to resume. Each resource
//     lists (the list replaces everything, so nothing of another cluster
//     survives it) and answers the snapshot's data, stale, until then.
//
// While the apiserver cannot be reached, the UID cannot be read: the
// resources answer from the snapshot, stale, and the check is made once it
// answers.
//
// With several clusters, the snapshot records each cluster's identity
// beside its part of each resource, and each cluster is checked on its
// own, through its own connection: a cluster whose identity changed drops
// its part alone (the source's objects of its key prefix) and starts
// cold, the others resume.

// checkCluster compares the snapshot's cluster with the apiserver's, once
// for all resources of the cluster ("" for the one cluster of a plan
// without clusters), and returns the verdict; an error when the apiserver
// could not be asked (try again later, answering from the snapshot). On
// clusterOther, every restored resource's data of that cluster is cleared
// before it returns.
func (e *Engine) checkCluster(ctx context.Context, cluster string) (follow.Verdict, error) {
	id := e.identOf(cluster)
	id.Mu.Lock()
	other := false
	defer func() {
		id.Mu.Unlock()
		if other { // after id.mu: writeWarmFile takes warm.mu, then id.mu
			e.warm.mu.Lock()
			if cluster == "" {
				e.warm.status.Load, e.warm.status.LoadReason, e.warm.status.WrittenAt = "cold", "cluster", time.Time{}
			} else {
				e.warm.status.setCluster(cluster, "cold", "cluster")
			}
			e.warm.mu.Unlock()
		}
	}()
	if id.Verdict != nil {
		return *id.Verdict, nil
	}
	if err := id.Read(ctx); err != nil {
		return follow.ClusterUnknown, err
	}
	v := follow.ClusterUnknown
	log := e.log
	if cluster != "" {
		log = log.With("clusterName", cluster)
	}
	switch {
	case id.Fetch == nil:
		v = follow.ClusterSame // an engine without a cluster: nothing to compare
	case id.Unreadable != nil:
		log.Warn("cannot read the cluster's identity (the UID of namespace "+follow.ClusterIDNamespace+"): the snapshot is not resumed, each resource lists",
			"error", id.Unreadable.Error())
	case id.Snapshot == "":
		log.Warn("the snapshot does not say which cluster it came from: not resumed, each resource lists", "cluster", id.ID)
	case id.Snapshot == id.ID:
		v = follow.ClusterSame
	default:
		v = follow.ClusterOther
		if cluster == "" {
			log.Warn("snapshot ignored: it came from another cluster; its data is cleared and every resource lists (cold start)",
				"snapshotCluster", id.Snapshot, "cluster", id.ID)
		} else {
			log.Warn("the cluster's part of the snapshot ignored: it came from another cluster; that part is cleared and the cluster's resources list (a cold start of this cluster alone)",
				"snapshotCluster", id.Snapshot, "cluster", id.ID)
		}
		v0, _ := e.view()
		for _, w := range v0.watchers {
			// Restored, or carried over a reload from restored data.
			if w.ClusterName == cluster && w.Unverified() && !w.SnapshotDropped.Swap(true) {
				w.Src.ReplaceWithin(w.KeyPrefix, nil)
				w.RV.Store(nil)
				w.Count.Store(0)
				w.NoteFresh()
			}
		}
		other = true
	}
	id.Verdict = &v
	return v, nil
}

// verified reports whether the snapshot's cluster was found to be the
// apiserver's (or there is no cluster to compare with): its data, still
// unlisted, may be resumed. cluster names one of several ("" for the
// one cluster of a plan without clusters).
func (e *Engine) verified(cluster string) bool {
	id := e.identOf(cluster)
	id.Mu.Lock()
	defer id.Mu.Unlock()
	return id.Fetch == nil || id.Verdict != nil && *id.Verdict == follow.ClusterSame
}

// clusterForSnapshot returns the identity to record in a snapshot written
// now: the apiserver's, read if need be; "" when it cannot be read; the
// restored snapshot's while the apiserver cannot be reached (its data is
// that cluster's, or was listed from one that did not answer since).
// Data of a snapshot not found to be this cluster's is written to be
// listed (see WriteSnapshot), whatever the identity says. cluster names
// one of several ("" for the one cluster of a plan without clusters).
func (e *Engine) clusterForSnapshot(cluster string) string {
	id := e.identOf(cluster)
	id.Mu.Lock()
	defer id.Mu.Unlock()
	if id.Verdict == nil && id.Snapshot != "" && id.Fetch != nil {
		// Not compared yet: a restored resource still holds the
		// snapshot's data, which checkCluster may have to drop first.
		return id.Snapshot
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := id.Read(ctx); err != nil {
		return id.Snapshot
	}
	return id.ID
}
