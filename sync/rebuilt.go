package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// errClusterChanged: the watch was not opened because the cluster behind
// the address changed (see above).
var errClusterChanged = errors.New("the cluster behind the address changed: listing from scratch")

// rereadEvery is how long one reading of a cluster's identity serves
// every resource of the cluster that checks it.
const rereadEvery = 2 * time.Second

// reread reads the identity of the cluster from etcd again, unless it was
// read less than maxAge ago, and returns the one read before (was) and now; the
// same when it did not change or cannot be told (RBAC forbids the read).
// The first reading only records the identity. kube-system gone where it
// was known reads as "".
func (id *identity) reread(ctx context.Context, maxAge time.Duration) (was, now string, err error) {
	id.mu.Lock()
	fetch := id.fetch
	// One that RBAC forbids is tried again a minute later (a credential
	// rotated meanwhile may read it).
	refused := id.unreadable != nil && !apierrors.IsNotFound(id.unreadable) && time.Since(id.rereadAt) < time.Minute
	cached := id.known && time.Since(id.rereadAt) < maxAge
	if fetch == nil || refused || cached {
		defer id.mu.Unlock()
		return id.id, id.id, nil
	}
	id.started++
	seq := id.started
	id.mu.Unlock()
	// Not under id.mu: the apiserver may take long to answer, and
	// answers, snapshots and reloads read the identity meanwhile.
	got, err := fetch(ctx, false)
	id.mu.Lock()
	defer id.mu.Unlock()
	if seq < id.landed {
		return id.id, id.id, nil // a reading begun later was taken: it wins
	}
	id.landed = seq
	switch {
	case err == nil:
	case apierrors.IsNotFound(err) && id.known:
		got = "" // the namespace is gone: not the cluster it was
	case permanent(err):
		id.unreadable, id.rereadAt = err, time.Now()
		return id.id, id.id, nil
	default:
		return "", "", err
	}
	was = id.id
	if !id.known {
		was = got
	}
	id.known, id.id, id.unreadable, id.rereadAt = got != "", got, nil, time.Now()
	return was, got, nil
}

// changing reports a cluster that changed behind its address and whose
// resources have not listed from scratch yet (its apiserver's cache
// still served the old one at the last look): its answers are stale.
func (id *identity) changing() bool { return id != nil && id.pending.Load() }

// verifyAfterTrouble checks the cluster before a watch opens at rv, when
// the watcher had trouble since the last check (see above). It returns
// errClusterChanged when the cluster changed, the error of a check that
// could not be made (recorded by the caller), else nil.
func (w *watcher) verifyAfterTrouble(ctx context.Context, rv string) error {
	if !w.troubled.Load() || w.identity == nil || rv == "" || rv == "0" || w.identity.changing() {
		return nil
	}
	// Bounded: an apiserver that does not answer must fail the watch soon
	// enough to be marked stale in time.
	ctx, cancel := context.WithTimeout(ctx, min(max(w.staleAfter/2, time.Second), 5*time.Second))
	defer cancel()
	was, now, err := w.identity.reread(ctx, rereadEvery)
	if err != nil {
		return fmt.Errorf("read the cluster's identity: %w", err)
	}
	why := ""
	if was != now {
		why = identityWhy(was, now)
	} else {
		current, err := w.currentVersion(ctx)
		switch {
		case errors.Is(err, errNoProbe):
			// The apiserver cannot tell: the identity is all there is.
		case err != nil:
			return err
		case newer(rv, current):
			why = fmt.Sprintf("its resourceVersion went back: the watch was at %s, the apiserver is at %s (etcd restored from a backup?)", rv, current)
		}
	}
	w.troubled.Store(false)
	if why == "" {
		return nil
	}
	w.changed(ctx, why)
	return errClusterChanged
}

// identityWhy says what changed of a cluster's identity.
func identityWhy(was, now string) string {
	return fmt.Sprintf("its identity changed: the UID of namespace %s was %q, is %q (a cluster rebuilt behind the same address?)", clusterIDNamespace, was, now)
}

// wentBack tells of another history when rv, of an event or a bookmark,
// is older than what the source is as of: a watch's come in order.
func (w *watcher) wentBack(rv string) {
	last := w.resourceVersion()
	if !newer(last, rv) || w.rebuilt.Load() || w.changed == nil {
		return
	}
	why := fmt.Sprintf("its resourceVersion went back within a watch: %s after %s (etcd replaced or restored under a running apiserver?)", rv, last)
	ctx := context.Background()
	if p := w.runCtx.Load(); p != nil {
		ctx = *p // its requests end with the watcher's run
	}
	go w.changed(ctx, why)
}

// clusterChanged marks every resource of the cluster stale, and lists
// them from scratch once the apiserver's cache knows the new cluster.
func (e *Engine) clusterChanged(ctx context.Context, cluster, why string) {
	v, _ := e.view()
	n := 0
	for _, w := range v.watchers {
		if w.clusterName == cluster {
			w.clusterChanges.Add(1)
			w.rebuilt.Store(true)
			w.rv.Store(nil) // not the cluster's data: a snapshot leaves it out
			w.noteFresh()
			n++
		}
	}
	id := e.identOf(cluster)
	id.settling.Lock() // after a look under way, which would clear it
	id.pending.Store(true)
	id.settling.Unlock()
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
	if !id.pending.Load() {
		return
	}
	id.settling.Lock() // one look at a time
	defer id.settling.Unlock()
	if !id.pending.Load() {
		return
	}
	log := e.clusterLog(cluster)
	inEtcd, cached, err := id.bothReadings(ctx)
	switch {
	case err != nil && !permanent(err):
		return // the apiserver cannot be asked: again later
	case err != nil:
		log.Info("the cluster's identity cannot be read, so nor whether the apiserver's cache knows the new cluster: each of its resources lists from scratch now", "error", err.Error())
	case cached != inEtcd || inEtcd == "":
		if !id.toldStale.Swap(true) {
			log.Warn("the apiserver still serves the old cluster from its cache (restart an apiserver left running while its etcd was replaced): the cluster's answers stay stale until it serves the new one",
				"cachedUID", cached, "etcdUID", inEtcd)
		}
		return
	default:
		id.mu.Lock()
		id.known, id.id, id.rereadAt = true, inEtcd, time.Now()
		id.started++
		id.landed = id.started // readings under way are older
		id.mu.Unlock()
		log.Info("the apiserver's cache serves what etcd holds: each of the cluster's resources lists from scratch", "uid", inEtcd)
	}
	id.toldStale.Store(false)
	v, _ := e.view()
	for _, w := range v.watchers {
		if w.clusterName == cluster {
			w.listFromScratch()
		}
	}
	id.pending.Store(false)
}

// bothReadings reads the cluster's identity from etcd and from the
// apiserver's cache; a namespace not found reads as "". An error says
// neither can be compared (permanent: never, see permanent).
func (id *identity) bothReadings(ctx context.Context) (inEtcd, cached string, err error) {
	id.mu.Lock()
	fetch := id.fetch
	id.mu.Unlock()
	if fetch == nil {
		return "", "", fmt.Errorf("namespace %s: %w", clusterIDNamespace, errNoUID)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i, cache := range []bool{false, true} {
		got, err := fetch(ctx, cache)
		if err != nil && !apierrors.IsNotFound(err) {
			return "", "", err
		}
		if i == 0 {
			inEtcd = got
		} else {
			cached = got
		}
	}
	return inEtcd, cached, nil
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
			if seen[w.clusterName] || w.identity == nil || !w.isSynced() {
				continue
			}
			seen[w.clusterName] = true
			if w.identity.changing() {
				e.settleChange(ctx, w.clusterName)
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			was, now, err := w.identity.reread(rctx, 0)
			cancel()
			if err == nil && was != now {
				e.clusterChanged(ctx, w.clusterName, identityWhy(was, now))
			}
		}
	}
}

// listFromScratch makes the watcher list again at once, asking for the
// current state; its answers stay stale (rebuilt) until that list is
// done.
func (w *watcher) listFromScratch() {
	w.rebuilt.Store(true)
	w.listFresh.Store(true)
	w.troubled.Store(false)
	w.rv.Store(nil)
	w.noteFresh()
	if f := w.relistNow.Load(); f != nil {
		(*f)()
	}
}

// recovered wakes the cluster's other resources that have not been
// answered since their trouble began, once per outage of from: one of
// them was answered again, so the cluster is back, and its resources
// return together rather than each at the end of its own backoff, which
// the reflector's retries of a watch stretch to 30 s: out of their
// backoff, and those whose part dropAfter removed to list at once. A
// resource whose list is under way is left to it.
func (e *Engine) recovered(from *watcher) {
	v, _ := e.view()
	for _, w := range v.watchers {
		if w == from || w.clusterName != from.clusterName || w.listing.Load() {
			continue
		}
		w.mu.Lock()
		since := w.failingSince
		w.mu.Unlock()
		if since.IsZero() || w.lastContact().After(since) {
			continue
		}
		select {
		case w.wake <- struct{}{}: // out of its backoff
		default:
		}
		// One whose part dropAfter removed lists anyway: at once, rather
		// than at the end of the reflector's retries. Another keeps its
		// part (stale) meanwhile, and resumes its watch as it would.
		if f := w.relistNow.Load(); f != nil && w.partDropped.Load() {
			(*f)()
		}
	}
}

// answeredAgain wakes the cluster's other resources (see recovered) the
// first time the watcher is answered in an outage.
func (w *watcher) answeredAgain() {
	if w.recovered != nil && w.lastError() != nil && !w.kicked.Swap(true) {
		go w.recovered()
	}
}
