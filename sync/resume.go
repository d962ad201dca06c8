package sync

import (
	"context"
	"errors"
	"math/rand/v2"
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
// the resource stale, answering from the snapshot). The resource has
// caught up once a resumed watch is established: the apiserver sends the
// events since a watch's resourceVersion first.
//
// resume returns true when the resource must be listed: the apiserver
// cannot resume from the resourceVersion (410 Gone after a compaction, a
// version it does not know), the resource is not served, or the resync
// period is up. It returns false when ctx ends.
func (w *watcher) resume(ctx context.Context) bool {
	wctx := ctx
	if w.plan.Resync > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, w.plan.Resync)
		defer cancel()
	}
	rv := w.resumeRV
	delay := newBackoff()
	for {
		if ctx.Err() != nil {
			return false
		}
		if wctx.Err() != nil {
			return true // the resync period is up: list
		}
		w.established.Store(0)
		timeout := int64(300 + rand.IntN(300)) // as the reflector: 5 to 10 minutes
		wi, err := w.WatchWithContext(wctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout})
		if err == nil {
			rv, err = w.applyEvents(wi, rv)
			wi.Stop()
		}
		if ctx.Err() != nil {
			return false
		}
		if err != nil && mustList(err) {
			w.log.Info("the snapshot's watch cannot be resumed: listing", "resourceVersion", rv, "error", err.Error())
			return true
		}
		at := w.established.Load()
		if at != 0 && time.Since(time.Unix(0, at)) >= backoffResetAfter {
			delay = newBackoff()
		}
		if err == nil && at != 0 {
			continue // a watch that worked and ended: the next one at once
		}
		if err != nil && !errors.Is(err, errWatchEnded) {
			// Errors of the request itself are recorded where they happen.
			w.fail(err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-wctx.Done():
		case <-time.After(delay.Step()):
		}
	}
}

// errWatchEnded: a watch's result channel closed.
var errWatchEnded = errors.New("watch ended")

// applyEvents writes the events of one resumed watch into the source until
// it ends, and returns the resourceVersion to resume from next; the error
// of an ERROR event, else errWatchEnded for a watch that ended before it
// was established, else nil.
func (w *watcher) applyEvents(wi watch.Interface, rv string) (string, error) {
	for ev := range wi.ResultChan() {
		var err error
		switch ev.Type {
		case watch.Added:
			err = w.Add(ev.Object)
		case watch.Modified:
			err = w.Update(ev.Object)
		case watch.Deleted:
			err = w.Delete(ev.Object)
		case watch.Bookmark:
			if o, ok := ev.Object.(*object); ok && o.rv != "" {
				w.UpdateResourceVersion(o.rv)
			}
		case watch.Error:
			// Recorded as a watch error by the tracked watch.
			return rv, apierrors.FromObject(ev.Object)
		}
		if err != nil {
			w.log.Warn("event left out", "type", string(ev.Type), "error", err.Error())
			continue
		}
		if o, ok := ev.Object.(*object); ok && o.rv != "" {
			rv = o.rv
		}
	}
	if w.established.Load() == 0 {
		return rv, errWatchEnded
	}
	return rv, nil
}

// mustList reports an answer of the apiserver that no retry of the same
// watch can change: the resourceVersion is compacted away or unknown to
// it, or the resource is not served.
func mustList(err error) bool {
	return isExpired(err) || apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) || apierrors.IsNotFound(err) ||
		apierrors.IsBadRequest(err) || apierrors.IsInvalid(err)
}
