package sync

import (
	"context"
	"errors"
	"fmt"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
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

// clusterVerdict is how a snapshot's cluster compares with the
// apiserver's.
type clusterVerdict int

const (
	clusterSame    clusterVerdict = iota // resume
	clusterUnknown                       // list, keeping the data meanwhile
	clusterOther                         // the data was dropped: list
)

// identity is the engine's knowledge of its cluster.
type identity struct {
	// fetch reads the cluster's identity, from etcd, or, cached, as the
	// apiserver's cache has it (see rebuilt.go); nil for an engine
	// without a cluster.
	fetch func(ctx context.Context, cached bool) (string, error)

	mu gosync.Mutex
	// snapshot: the identity recorded in the snapshot the engine was
	// restored from ("" for none or an unknown one).
	snapshot string
	// known: id was read from the apiserver; unreadable: it cannot be
	// (an answer that no retry changes), with why.
	known      bool
	id         string
	unreadable error
	verdict    *clusterVerdict // once decided
	// rereadAt: when reread last read it (see rebuilt.go); started,
	// landed: the sequence of the readings begun, and of the last one
	// taken (an older one that lands later is dropped).
	rereadAt        time.Time
	started, landed uint64
	// pending: the cluster changed behind its address, and its
	// resources have not listed from scratch yet; toldStale: its
	// apiserver's cache serving the old one was logged; settling is
	// held by the one look at a time at the cache (see settleChange).
	pending, toldStale atomic.Bool
	settling           gosync.Mutex
}

// identities are the identities of the clusters of a plan that reads
// several, by cluster name (see identOf).
type identities struct {
	mu     gosync.Mutex
	byName map[string]*identity
}

// identOf returns the identity of a cluster: the engine's own for ""
// (a plan without clusters), else the named cluster's, read through its
// current connection (none for an engine without connections: nothing
// to compare).
func (e *Engine) identOf(cluster string) *identity {
	if cluster == "" {
		return &e.ident
	}
	e.idents.mu.Lock()
	defer e.idents.mu.Unlock()
	if e.idents.byName == nil {
		e.idents.byName = map[string]*identity{}
	}
	id := e.idents.byName[cluster]
	if id == nil {
		id = &identity{}
		if conns := e.conns; conns != nil {
			id.fetch = func(ctx context.Context, cached bool) (string, error) { return conns.fetchID(ctx, cluster, cached) }
		}
		e.idents.byName[cluster] = id
	}
	return id
}

// forget makes the identity be read again: the cluster's connection
// changed, and may reach another cluster. What was decided of the
// snapshot stays.
func (id *identity) forget() {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.known, id.id, id.unreadable = false, "", nil
	id.started++
	id.landed = id.started // a reading under way went through the old connection
}

// clusterIDNamespace is the namespace whose UID names a cluster.
const clusterIDNamespace = "kube-system"

// fetchClusterID returns a function that reads the UID of the
// kube-system namespace with client, a client of the core API group:
// from etcd (a GET without resourceVersion), or, cached, from the
// apiserver's cache (resourceVersion=0).
func fetchClusterID(client rest.Interface) func(ctx context.Context, cached bool) (string, error) {
	return func(ctx context.Context, cached bool) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		req := client.Get().AbsPath("/api/v1/namespaces", clusterIDNamespace)
		if cached {
			req = req.Param("resourceVersion", "0")
		}
		body, err := req.DoRaw(ctx)
		if err != nil {
			return "", err
		}
		uid := gjson.GetBytes(body, "metadata.uid").Str
		if uid == "" {
			return "", fmt.Errorf("namespace %s: %w", clusterIDNamespace, errNoUID)
		}
		return uid, nil
	}
}

// permanent reports an answer to the identity's GET that no retry
// changes: forbidden, unauthorized for it, or no such namespace.
func permanent(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsUnauthorized(err) ||
		errors.Is(err, errNoUID)
}

var errNoUID = errors.New("no metadata.uid")

// read reads the identity once it is known or known to be unreadable;
// under id.mu.
func (id *identity) read(ctx context.Context) error {
	if id.known || id.unreadable != nil || id.fetch == nil {
		return nil
	}
	got, err := id.fetch(ctx, false)
	switch {
	case err == nil:
		id.known, id.id = true, got
	case permanent(err):
		id.unreadable = err
	default:
		return err
	}
	return nil
}

// checkCluster compares the snapshot's cluster with the apiserver's, once
// for all resources of the cluster ("" for the one cluster of a plan
// without clusters), and returns the verdict; an error when the apiserver
// could not be asked (try again later, answering from the snapshot). On
// clusterOther, every restored resource's data of that cluster is cleared
// before it returns.
func (e *Engine) checkCluster(ctx context.Context, cluster string) (clusterVerdict, error) {
	id := e.identOf(cluster)
	id.mu.Lock()
	other := false
	defer func() {
		id.mu.Unlock()
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
	if id.verdict != nil {
		return *id.verdict, nil
	}
	if err := id.read(ctx); err != nil {
		return clusterUnknown, err
	}
	v := clusterUnknown
	log := e.log
	if cluster != "" {
		log = log.With("clusterName", cluster)
	}
	switch {
	case id.fetch == nil:
		v = clusterSame // an engine without a cluster: nothing to compare
	case id.unreadable != nil:
		log.Warn("cannot read the cluster's identity (the UID of namespace "+clusterIDNamespace+"): the snapshot is not resumed, each resource lists",
			"error", id.unreadable.Error())
	case id.snapshot == "":
		log.Warn("the snapshot does not say which cluster it came from: not resumed, each resource lists", "cluster", id.id)
	case id.snapshot == id.id:
		v = clusterSame
	default:
		v = clusterOther
		if cluster == "" {
			log.Warn("snapshot ignored: it came from another cluster; its data is cleared and every resource lists (cold start)",
				"snapshotCluster", id.snapshot, "cluster", id.id)
		} else {
			log.Warn("the cluster's part of the snapshot ignored: it came from another cluster; that part is cleared and the cluster's resources list (a cold start of this cluster alone)",
				"snapshotCluster", id.snapshot, "cluster", id.id)
		}
		v0, _ := e.view()
		for _, w := range v0.watchers {
			// Restored, or carried over a reload from restored data.
			if w.clusterName == cluster && w.unverified() && !w.dropped.Swap(true) {
				w.src.ReplaceWithin(w.keyPrefix, nil)
				w.rv.Store(nil)
				w.count.Store(0)
				w.noteFresh()
			}
		}
		other = true
	}
	id.verdict = &v
	return v, nil
}

// verified reports whether the snapshot's cluster was found to be the
// apiserver's (or there is no cluster to compare with): its data, still
// unlisted, may be resumed. cluster names one of several ("" for the
// one cluster of a plan without clusters).
func (e *Engine) verified(cluster string) bool {
	id := e.identOf(cluster)
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.fetch == nil || id.verdict != nil && *id.verdict == clusterSame
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
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.verdict == nil && id.snapshot != "" && id.fetch != nil {
		// Not compared yet: a restored resource still holds the
		// snapshot's data, which checkCluster may have to drop first.
		return id.snapshot
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := id.read(ctx); err != nil {
		return id.snapshot
	}
	return id.id
}
