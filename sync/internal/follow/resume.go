package follow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// resume keeps a resource restored from a snapshot up to date with watches
// that start at the snapshot's resourceVersion, then at the last one seen:
// no list. A watch that the apiserver ends normally is started again at
// once; one it could not open or that broke is tried again after the
// backoff, from where it was (an apiserver that cannot be reached leaves
// the resource stale, answering from the snapshot).
//
// Before its first watch, resume checks that the snapshot came from this
// cluster (Engine.checkCluster: another cluster's data is dropped, data of
// an unknown one is listed), then asks the apiserver for its current
// resourceVersion (see currentVersion): a snapshot from the future (etcd
// restored from a backup) would otherwise wait, silent, for a version
// that may never come.
//
// The resource has caught up, and is no longer stale, once its watch has
// delivered an event or a bookmark at or past that resourceVersion. This
// rests on what the apiserver guarantees of a watch: its events come in
// the order of their resourceVersions, each after every change before it,
// and a bookmark's resourceVersion says that every change up to it has
// been sent. Events since the snapshot can take long to replay (a slow
// link, a long outage): until then the answers stay marked stale, and
// WaitForSync waits. Bookmarks are sent when the apiserver chooses (its
// watch cache sends one shortly before a watch's timeout, and about every
// minute): until caught up, resume's watches time out after
// catchUpTimeout, so that a quiet resource hears one soon. Two such
// watches in a row that deliver nothing (an apiserver that sends no
// bookmarks, its watch cache off) make it list.
//
// resume returns true when the resource must be listed: the apiserver
// cannot resume from the resourceVersion (410 Gone after a compaction, a
// version it does not know or refuses), the resource is not served, or the
// resync period is up. It returns false when ctx ends.
func (w *Watcher) resume(ctx context.Context) bool {
	wctx := ctx
	if w.Plan.Resync > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, w.Plan.Resync)
		defer cancel()
	}
	rv := w.ResumeRV
	delay := newBackoff()
	checked, identified := false, false
	// target: the apiserver's resourceVersion when asked, which the watch
	// must reach; "" once caught up, or when it could not be asked (then
	// the first bookmark counts).
	var target string
	idle := 0    // watches in a row that ended, not caught up, having delivered nothing
	refused := 0 // answers of the apiserver in a row that were errors
	for {
		if ctx.Err() != nil {
			return false
		}
		if wctx.Err() != nil {
			return true // the resync period is up: list
		}
		var err error
		var list bool
		if !identified && w.Cluster != nil {
			if identified, list, err = w.identify(ctx, wctx); list {
				return true
			}
		}
		if err == nil && !checked {
			if checked, target, list, err = w.probeVersion(wctx, rv); list {
				return true
			}
		}
		if err == nil {
			w.established.Store(0)
			timeout := int64(300 + rand.IntN(300)) // as the reflector: 5 to 10 minutes
			if !w.Listed1() {
				timeout = int64(catchUpTimeout / time.Second)
			}
			var wi watch.Interface
			wi, err = w.watchWithContext(wctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout})
			if err == nil {
				var delivered int
				rv, delivered, err = w.applyEvents(wi, rv, target)
				wi.Stop()
				if err == nil && !w.Listed1() && delivered == 0 {
					if idle++; idle >= 2 {
						w.Log.Info("the resumed watch sent neither events nor bookmarks to tell that it caught up: listing", "resourceVersion", rv, "apiserver", target)
						return true
					}
				} else {
					idle = 0
				}
			}
		}
		if ctx.Err() != nil {
			return false
		}
		if errors.Is(err, errClusterChanged) {
			return true // logged by clusterChanged, once for all resources
		}
		if err != nil && mustList(err) {
			w.Log.Info("the snapshot's watch cannot be resumed: listing", "resourceVersion", rv, "error", err.Error())
			return true
		}
		// An apiserver that answers, but with errors, three times in a row
		// (a 500 for a resourceVersion it cannot parse, say): list. One that
		// cannot be reached is waited for, serving the snapshot.
		var status apierrors.APIStatus
		if errors.As(err, &status) {
			if refused++; refused >= 3 {
				w.Log.Info("the snapshot's watch was refused three times: listing", "resourceVersion", rv, "error", err.Error())
				return true
			}
		} else if err == nil {
			refused = 0
		}
		at := w.established.Load()
		if at != 0 && time.Since(time.Unix(0, at)) >= backoffResetAfter {
			delay = newBackoff()
		}
		if err == nil && at != 0 {
			continue // a watch that worked and ended: the next one at once
		}
		// Errors are recorded where they happen: by WatchWithContext, the
		// tracked watch and currentVersion.
		select {
		case <-ctx.Done():
			return false
		case <-wctx.Done():
		case <-time.After(delay.Step()):
		case <-w.Wake: // another resource of the cluster is answered again
		}
	}
}

// ResumeOrList runs resume with a context that relistNow ends (the
// cluster changed behind its address, or its others came back: list at
// once), and reports whether run goes on: to list, or, false, ctx ended.
func (w *Watcher) ResumeOrList(ctx context.Context) bool {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var relist atomic.Bool
	stop := func() { relist.Store(true); cancel() }
	w.RelistNow.Store(&stop)
	list := w.resume(rctx)
	if ctx.Err() != nil {
		return false
	}
	return list || relist.Load() || w.listFresh.Load()
}

// identify reads the identity of the watcher's cluster: the one the
// snapshot was written from (same), another (list: the snapshot is not
// resumed there), or an error, recorded, to try again.
func (w *Watcher) identify(ctx, wctx context.Context) (same, list bool, err error) {
	verdict, err := w.Cluster(wctx)
	if err != nil {
		if ctx.Err() == nil {
			w.Fail(fmt.Errorf("read the cluster's identity: %w", err))
		}
		return false, false, err
	}
	if verdict == ClusterSame {
		return true, false, nil
	}
	return false, true, nil // logged by checkCluster, once for all resources
}

// probeVersion asks the apiserver for its current resourceVersion: target, which
// the resumed watch from rv must reach ("" when the apiserver cannot tell:
// the first bookmark counts). list: the snapshot cannot be resumed. An
// error (not checked) is tried again.
func (w *Watcher) probeVersion(ctx context.Context, rv string) (checked bool, target string, list bool, err error) {
	current, err := w.currentVersion(ctx)
	switch {
	case err == nil:
		if _, perr := strconv.ParseUint(current, 10, 64); perr != nil {
			// Not an etcd revision: no way to tell when a watch has
			// reached it.
			w.Log.Info("the apiserver's resourceVersion is not a number: listing", "apiserver", current)
			return true, current, true, nil
		}
		if newer(rv, current) {
			w.Log.Warn("the snapshot's resourceVersion is newer than the apiserver's (etcd restored from a backup?): listing",
				"resourceVersion", rv, "apiserver", current)
			return true, current, true, nil
		}
		if rv == current {
			w.caughtUp(rv) // nothing changed since the snapshot
		}
		return true, current, false, nil
	case errors.Is(err, errNoProbe):
		// An apiserver without it: caught up at the first bookmark.
		w.Log.Info("cannot ask the apiserver for its resourceVersion: stale until the first bookmark", "error", err.Error())
		return true, "", false, nil
	}
	return false, "", false, err
}

// errNoProbe: the apiserver cannot tell its current resourceVersion by a
// watch (no streaming lists), or does not allow this one.
var errNoProbe = errors.New("no initial-events-end bookmark")

// probeName matches no object: a field selector of it selects nothing.
const probeName = "metasync.invalid..probe"

// currentVersion asks the apiserver for its current resourceVersion with a
// watch that sends the initial state and then a bookmark: a field selector
// that matches no object makes the state empty, so it costs one small
// WATCH request and no LIST.
func (w *Watcher) currentVersion(parent context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(parent, 30*time.Second)
	defer cancel()
	yes := true
	timeout := int64(30)
	opts := metav1.ListOptions{Watch: true, SendInitialEvents: &yes, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks: true, FieldSelector: "metadata.name=" + probeName, TimeoutSeconds: &timeout}
	req := w.rest().Get().Resource(w.Plan.GVR.Resource).VersionedParams(&opts, metav1.ParameterCodec)
	if w.Plan.Namespace != "" {
		req = req.Namespace(w.Plan.Namespace)
	}
	wi, err := req.Watch(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.CheckGone(err)
			w.watchErrors.Add(1)
			w.Fail(fmt.Errorf("watch: %w", err))
		}
		if apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsMethodNotSupported(err) {
			return "", fmt.Errorf("%w: %w", errNoProbe, err)
		}
		return "", err
	}
	defer wi.Stop()
	for ev := range wi.ResultChan() {
		switch ev.Type {
		case watch.Bookmark:
			if o, ok := ev.Object.(*Projected); ok && o.RV != "" {
				return o.RV, nil
			}
		case watch.Error:
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) {
				return "", fmt.Errorf("%w: %w", errNoProbe, err)
			}
			return "", err
		}
	}
	if parent.Err() != nil {
		return "", parent.Err()
	}
	// Ended, or timed out, without the bookmark: an apiserver that does
	// not send it.
	return "", errNoProbe
}

// newer reports whether resourceVersion a is newer than b, both as the
// apiserver's integers; false when either is not one (they are opaque to
// clients, and only etcd-backed ones are integers).
func newer(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x > y
}

// catchUpTimeout is the timeout of resumed watches until the resource
// has caught up: the apiserver's watch cache sends a bookmark shortly
// before it (2 s).
const catchUpTimeout = 5 * time.Second

// reached reports whether resourceVersion rv is target or past it, both
// as the apiserver's integers; false when either is not one.
func reached(rv, target string) bool { return rv == target || newer(rv, target) }

// applyEvents writes the events of one resumed watch into the source until
// it ends, and returns the resourceVersion to resume from next and how
// many events and bookmarks it delivered; the error of an ERROR event,
// else errWatchEnded for a watch that ended before it was established,
// else nil. The resource has caught up (watcher.caughtUp) once an event
// or a bookmark reaches target, or at the first bookmark when target is
// "".
func (w *Watcher) applyEvents(wi watch.Interface, rv, target string) (string, int, error) {
	delivered := 0
	for ev := range wi.ResultChan() {
		delivered++
		var err error
		switch ev.Type {
		case watch.Added:
			err = w.Add(ev.Object)
		case watch.Modified:
			err = w.Update(ev.Object)
		case watch.Deleted:
			err = w.Delete(ev.Object)
		case watch.Bookmark:
			if o, ok := ev.Object.(*Projected); ok && o.RV != "" {
				w.bookmark(o.RV)
			}
		case watch.Error:
			// Recorded as a watch error by the tracked watch.
			return rv, delivered, apierrors.FromObject(ev.Object)
		}
		if err != nil {
			w.Log.Warn("event left out", "type", string(ev.Type), "error", err.Error())
			continue
		}
		if o, ok := ev.Object.(*Projected); ok && o.RV != "" {
			rv = o.RV
			// The write is done: what a watch sent up to rv is in the
			// source.
			if target == "" && ev.Type == watch.Bookmark || target != "" && reached(rv, target) {
				w.caughtUp(rv)
			}
		}
	}
	if w.established.Load() == 0 {
		return rv, delivered, errWatchEnded
	}
	return rv, delivered, nil
}

// errWatchEnded: a watch's result channel closed before it was
// established.
var errWatchEnded = errors.New("watch ended")

// mustList reports an answer of the apiserver that no retry of the same
// watch can change: the resourceVersion is compacted away or unknown to
// it, or the resource is not served.
func mustList(err error) bool {
	return isExpired(err) || apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) || apierrors.IsNotFound(err) ||
		apierrors.IsBadRequest(err) || apierrors.IsInvalid(err)
}
