package follow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// --- cache.ListerWatcher: raw JSON in, projected objects out ---

func (w *Watcher) request(opts *metav1.ListOptions) *rest.Request {
	opts.LabelSelector = w.Plan.LabelSelector
	opts.FieldSelector = w.Plan.FieldSelector
	// No retry inside client-go: a request that fails is a failure the
	// watcher counts and backs off from at once, not after its retries
	// (each as long as the timeout) have hidden an outage from staleness.
	req := w.rest().Get().MaxRetries(0).Resource(w.Plan.GVR.Resource).VersionedParams(opts, metav1.ParameterCodec)
	if w.Plan.Namespace != "" {
		req = req.Namespace(w.Plan.Namespace)
	}
	return req
}

func (w *Watcher) listWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	if opts.Continue == "" {
		w.listed.Store(0)
	}
	w.Listing.Store(true)
	defer w.Listing.Store(false)
	if opts.Continue == "" && w.listFresh.Swap(false) {
		opts.ResourceVersion = "0" // the current state, as below
	}
	if opts.ResourceVersion == "0" {
		// The reflector's first list asks for "any" version, which the
		// apiserver's watch cache may serve stale. Ask for the current
		// state instead (served from the cache too, once it has caught up),
		// in one response: after WaitForSync, every write made before Start
		// is visible.
		opts.ResourceVersion, opts.ResourceVersionMatch, opts.Limit = "", "", 0
	}
	start := time.Now()
	defer func() {
		if ctx.Err() == nil {
			w.lists.Add(1)
			w.listNanos.Add(int64(time.Since(start)))
		}
	}()
	var list *objectList
	var err error
	if opts.Continue == "" && opts.ResourceVersionMatch != metav1.ResourceVersionMatchExact && w.Streaming.Load() {
		list, err = w.listByWatch(ctx, opts.ResourceVersion)
		switch {
		case errors.Is(err, errNoStreamingList):
			w.Streaming.Store(false)
			w.refused.Store(true)
			w.Log.Info("the apiserver does not stream lists as watch events: listing with LIST from now on", "reason", err.Error())
			list, err = nil, nil
		case err != nil && ctx.Err() == nil:
			// A LIST may work where the watch did not (a watch that
			// keeps failing must not keep the resource from syncing).
			w.Log.Debug("streaming list failed: listing with LIST", "error", err.Error())
			list, err = nil, nil
		case err != nil:
			return nil, err // a stop or a resync, not trouble
		}
	}
	if list == nil {
		body, rerr := w.request(&opts).Stream(ctx)
		if rerr != nil {
			if ctx.Err() != nil {
				return nil, rerr // a stop or a resync, not trouble
			}
			w.CheckGone(rerr)
			w.listErrors.Add(1)
			w.Fail(fmt.Errorf("list: %w", rerr))
			return nil, rerr
		}
		list, err = StreamList(body, w.Project)
		body.Close()
	}
	if list != nil {
		w.listed.Add(int64(len(list.Items)))
		w.Log.Debug("list page", "objects", len(list.Items), "took", time.Since(start).String())
	}
	w.gone.Store(false)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		w.listErrors.Add(1)
		w.Fail(fmt.Errorf("list: %w", err))
		return nil, err
	}
	// A list that works does not clear the error: the resource is fresh
	// again only once a watch is established (see trackedWatch).
	return list, nil
}

func (w *Watcher) watchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if err := w.verifyAfterTrouble(ctx, opts.ResourceVersion); err != nil {
		if ctx.Err() != nil || errors.Is(err, errClusterChanged) {
			return nil, err // a stop, or a list from scratch: not trouble
		}
		w.watchErrors.Add(1)
		w.Fail(fmt.Errorf("watch: %w", err))
		return nil, err
	}
	opts.Watch = true
	wi, err := w.request(&opts).Watch(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err // a stop or a resync, not trouble
		}
		w.CheckGone(err)
		w.watchErrors.Add(1)
		w.Fail(fmt.Errorf("watch: %w", err))
		return nil, err
	}
	w.watches.Add(1)
	w.Log.Debug("watch started", "resourceVersion", opts.ResourceVersion)
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return w.track(ctx, wi, timeout), nil
}

// CheckGone clears the resource's keys when the apiserver stops serving it
// (its CRD was deleted, say): nothing can be known of it any more, and
// stale answers would route calls to what is gone. The next successful
// list brings everything back.
func (w *Watcher) CheckGone(err error) {
	if !apierrors.IsNotFound(err) || w.gone.Swap(true) {
		return
	}
	if !w.IsSynced() {
		w.Log.Warn("resource not served by the apiserver (is its CRD installed? is resource: its plural?): not synced, retrying", "gvr", w.Plan.GVR.String(), "error", err.Error())
		return
	}
	w.Src.ReplaceWithin(w.KeyPrefix, nil) // this cluster's part alone
	w.Count.Store(0)
	// Its objects are gone from the source, not from the cluster's
	// history: a snapshot must not resume from here (it leaves the
	// resource out until the next list).
	w.RV.Store(nil)
	w.Log.Warn("resource not served any more: its keys are cleared until it returns", "gvr", w.Plan.GVR.String(), "error", err.Error())
}

// IsWatchListSemanticsUnSupported keeps the reflector on LIST then WATCH.
// With Options.StreamingList the watcher's List streams the list itself
// (listByWatch) and hands the reflector one page of projected objects,
// with no store of the reflector's in between.
func (lister) IsWatchListSemanticsUnSupported() bool { return true }

// errNoStreamingList: the apiserver does not stream a list as watch
// events (sendInitialEvents), or not for this request.
var errNoStreamingList = errors.New("no streaming list")

// streamingListTimeout bounds a streaming list: an apiserver too old to
// know sendInitialEvents sends the objects but never the bookmark that
// ends them, and its watch ends after this; the watcher then lists.
const streamingListTimeout = 60

// listByWatch lists the resource as the apiserver streams it (a watch
// with sendInitialEvents, the watch-list feature): each object
// is projected as its event arrives, and the list ends at the bookmark
// that closes the initial events, whose resourceVersion is the list's.
// The apiserver serves it from its cache without building the whole list
// in memory, which a LIST of the same objects does for each caller (a
// cold rollout of many engines is measured in BENCHMARKS.md). rv is the
// reflector's: "" or "0" ask for the current state, as ListWithContext's
// LIST does; another is the oldest state it may be.
//
// An apiserver that refuses the request (the feature off, an old
// version), or whose watch runs to its timeout without the bookmark,
// gives errNoStreamingList: the watcher lists from then on. Any other
// failure is the caller's to retry as a LIST.
func (w *Watcher) listByWatch(ctx context.Context, rv string) (*objectList, error) {
	if rv == "0" {
		rv = ""
	}
	yes := true
	timeout := int64(streamingListTimeout)
	opts := metav1.ListOptions{Watch: true, SendInitialEvents: &yes, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout}
	// The apiserver ends the watch at timeoutSeconds; this bounds it on
	// this side too, for a server or proxy that would not.
	lctx, cancel := context.WithTimeout(ctx, (streamingListTimeout+10)*time.Second)
	defer cancel()
	start := time.Now()
	wi, err := w.request(&opts).Watch(lctx)
	if err != nil {
		if refusesStreamingList(err) {
			return nil, fmt.Errorf("%w: %w", errNoStreamingList, err)
		}
		return nil, err
	}
	defer wi.Stop()
	// The state the initial events build, by object key: an apiserver may
	// send changes and deletes among them (the end bookmark of some
	// versions comes from a timer), as client-go's own streaming list
	// applies them to a store.
	state := map[string]runtime.Object{}
	for ev := range wi.ResultChan() {
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			o, ok := ev.Object.(*Projected)
			if !ok {
				return nil, fmt.Errorf("streaming list: a %s event of %T", ev.Type, ev.Object)
			}
			if ev.Type == watch.Deleted {
				delete(state, o.Ix.Key)
			} else {
				state[o.Ix.Key] = o
			}
		case watch.Bookmark:
			o, ok := ev.Object.(*Projected)
			if !ok || !o.initialEnd {
				continue
			}
			if o.RV == "" {
				return nil, errors.New("streaming list: the bookmark that ends the initial events has no resourceVersion")
			}
			list := &objectList{ListMeta: metav1.ListMeta{ResourceVersion: o.RV}, Items: make([]runtime.Object, 0, len(state))}
			for _, o := range state {
				list.Items = append(list.Items, o)
			}
			return list, nil
		case watch.Error:
			err := apierrors.FromObject(ev.Object)
			if refusesStreamingList(err) {
				return nil, fmt.Errorf("%w: %w", errNoStreamingList, err)
			}
			return nil, err
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	err = fmt.Errorf("streaming list: the watch ended before the bookmark that ends its initial events (%d objects sent, after %s)", len(state), time.Since(start).Round(time.Millisecond))
	if time.Since(start) >= (streamingListTimeout-5)*time.Second {
		// It ran to its timeout with no bookmark: an apiserver that does
		// not know sendInitialEvents sends the objects and never one.
		return nil, fmt.Errorf("%w: %w", errNoStreamingList, err)
	}
	return nil, err // a connection that ended: the next list streams again
}

// refusesStreamingList reports whether err says the apiserver does not
// stream this list: it does not know the request's parameters, or may
// not serve it as a watch.
func refusesStreamingList(err error) bool {
	return apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || apierrors.IsMethodNotSupported(err) || apierrors.IsForbidden(err)
}

// establishedAfter is how long a watch must stay open without an error to
// count as established, whether or not it delivers events.
const establishedAfter = time.Second

// track wraps a watch that the apiserver accepted. The watch is
// established once it stays open establishedAfter without an ERROR event;
// an ERROR event, or an end before it was established, is a failure.
// Neither counts while ctx ends or the reflector stops the watch: a stop
// or a resync.
func (w *Watcher) track(ctx context.Context, inner watch.Interface, timeout time.Duration) watch.Interface {
	t := &trackedWatch{inner: inner, out: make(chan watch.Event), stop: make(chan struct{})}
	w.watching.Store(t)
	w.rotating.Store(false)
	go w.follow(ctx, t, timeout)
	return t
}

// follow passes the watch's events on and records how it went (see
// track). A watch that the apiserver ends well before timeout (its
// requested timeoutSeconds; 0: none) was ended for a reason of the
// apiserver's (a restart, its storage reinitialized): no failure, but the
// cluster is checked before the next watch (see verifyAfterTrouble).
func (w *Watcher) follow(ctx context.Context, t *trackedWatch, timeout time.Duration) {
	defer close(t.out)
	started := time.Now()
	defer func() {
		w.watchesEnded.Add(1)
		w.watchNanos.Add(int64(time.Since(started)))
	}()
	timer := time.NewTimer(establishedAfter)
	defer timer.Stop()
	established, failed := false, false
	stopping := func() bool { return ctx.Err() != nil || t.stopped() || t.rotated.Load() }
	in := t.inner.ResultChan()
	for {
		select {
		case ev, ok := <-in:
			if !ok {
				if !established && !failed && !stopping() {
					w.watchErrors.Add(1)
					// The same text every time: a changed message is logged again.
					w.Fail(fmt.Errorf("watch: ended within %s of its start", establishedAfter))
				}
				if !stopping() && (timeout == 0 || time.Since(started) < timeout*9/10) {
					w.troubled.Store(true)
				}
				return
			}
			// Events do not establish a watch by themselves: one that
			// delivers an event and then fails, over and over, never
			// keeps working, and the resource must go stale.
			if ev.Type == watch.Error && !failed && !stopping() {
				failed = true
				w.watchErrors.Add(1)
				w.Fail(fmt.Errorf("watch: %w", apierrors.FromObject(ev.Object)))
			}
			select {
			case t.out <- ev:
			case <-t.stop:
				return
			}
		case <-timer.C:
			if !failed && !stopping() {
				established = true
				w.WatchEstablished()
			}
		case <-t.stop:
			return
		}
	}
}

// Fail records a list or watch error. Status shows it until a watch is
// established again, and the resource turns stale once that has not
// happened for staleAfter since the first error.
func (w *Watcher) Fail(err error) {
	w.failures.Add(1)
	w.troubled.Store(true)
	w.Answered.Store(false)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if w.lastErr == nil || w.lastErr.Error() != err.Error() {
		level := slog.LevelWarn
		if isExpired(err) {
			level = slog.LevelInfo // compaction: normal, the reflector lists again
		}
		w.Log.Log(context.Background(), level, "watch trouble", "error", err.Error())
	}
	if w.FailingSince.IsZero() {
		w.kicked.Store(false) // an outage begins
		w.move([2]Phase{PhaseHealthy, PhaseFailing})
		// A connection found dead by its health check had been silent
		// that long already: the outage is counted from its start.
		silent := silentFor(err)
		w.FailingSince = time.Now().Add(-silent)
		if w.StaleAfter > 0 && !w.over {
			since := w.FailingSince
			w.cutTimer = time.AfterFunc(max(w.StaleAfter-silent, 0), func() { w.cutOff(since) })
		}
		if w.DropAfter > 0 && !w.over {
			// Stale may come early (the safe side); removing answers may
			// not: dropAfter counts from the failure seen, not from the
			// silence before it.
			since := w.FailingSince
			w.dropTimer = time.AfterFunc(w.DropAfter, func() { w.dropPart(since) })
		}
	}
	w.lastErr = err
}

// silentFor returns how long a connection had been silent when err ended
// it: client-go's HTTP/2 health check drops a connection on which nothing
// came for HTTP2_READ_IDLE_TIMEOUT_SECONDS (30 by default) and then no
// answer to a ping for HTTP2_PING_TIMEOUT_SECONDS (15); 0 for any other
// error.
func silentFor(err error) time.Duration {
	if err == nil || !strings.Contains(err.Error(), "http2: client connection lost") {
		return 0
	}
	seconds := func(name string, def int) time.Duration {
		if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n >= 0 {
			return time.Duration(n) * time.Second
		}
		return time.Duration(def) * time.Second
	}
	return seconds("HTTP2_READ_IDLE_TIMEOUT_SECONDS", 30) + seconds("HTTP2_PING_TIMEOUT_SECONDS", 15)
}

// cutOff marks a synced resource stale when its watch has failed for
// staleAfter since since, and has not been established in between: an
// answer never looks current while its source is cut off. A resource not
// synced yet answers nothing to mark: it is looked at again staleAfter
// later, for as long as that outage lasts.
func (w *Watcher) cutOff(since time.Time) {
	w.Mu.Lock()
	still := w.FailingSince.Equal(since) && w.lastErr != nil && !w.over
	var reason string
	if still {
		reason = w.lastErr.Error()
		if !w.IsSynced() {
			w.cutTimer = time.AfterFunc(w.StaleAfter, func() { w.cutOff(since) })
			still = false
		}
	}
	w.Mu.Unlock()
	if !still {
		return
	}
	if _, moved := w.move([2]Phase{PhaseFailing, PhaseCut}, [2]Phase{PhaseDropped, PhaseDroppedCut}); !moved {
		return
	}
	w.Log.Warn("answers are stale: the watch has failed this long; they keep what the resource last knew until a watch is established again",
		"failedFor", time.Since(since).Round(time.Millisecond).String(), "error", reason)
	w.NoteFresh()
}

// dropPart removes the cluster's part of the resource from the answers
// when its watch has failed for dropAfter since since, and has not been
// established in between: callers fail over to the other clusters. The
// run lists again at once, and the list that works brings the part back
// (a watch resumed without a list would not).
func (w *Watcher) dropPart(since time.Time) {
	w.Mu.Lock()
	still := w.FailingSince.Equal(since) && w.lastErr != nil && !w.over
	reason := ""
	if still {
		reason = w.lastErr.Error()
	}
	w.Mu.Unlock()
	if !still {
		return
	}
	if _, moved := w.move([2]Phase{PhaseFailing, PhaseDropped}, [2]Phase{PhaseCut, PhaseDroppedCut}); !moved {
		return
	}
	w.Src.ReplaceWithin(w.KeyPrefix, nil)
	w.Count.Store(0)
	w.Failing.Replace(nil)
	w.Log.Warn("the cluster's part left the answers: its watch has failed for dropAfter; it comes back with the next list that works",
		"dropAfter", w.DropAfter.String(), "error", reason)
	if f := w.RelistNow.Load(); f != nil {
		(*f)()
	}
	w.NoteFresh()
}

// WatchEstablished records a watch that works: the resource is fresh.
func (w *Watcher) WatchEstablished() {
	now := time.Now()
	w.established.CompareAndSwap(0, now.UnixNano())
	w.contact.Store(now.UnixNano())
	w.Answered.Store(true)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if w.lastErr != nil {
		w.Log.Info("watch recovered", "failedFor", now.Sub(w.FailingSince).Round(time.Millisecond).String())
		if w.Recovered != nil && !w.kicked.Swap(true) {
			go w.Recovered()
		}
	}
	w.lastErr, w.FailingSince = nil, time.Time{}
	if w.cutTimer != nil {
		w.cutTimer.Stop()
		w.cutTimer = nil
	}
	if w.dropTimer != nil {
		w.dropTimer.Stop()
		w.dropTimer = nil
	}
	if was, _ := w.move([2]Phase{PhaseFailing, PhaseHealthy}, [2]Phase{PhaseCut, PhaseHealthy}, [2]Phase{PhaseDroppedCut, PhaseDropped}); was.cut() {
		w.Log.Info("answers are current again: the watch is established, after a list")
		w.NoteFresh()
	}
}

// caughtUp records a resumed watch that has delivered the apiserver's
// state as of when resume asked for it: the resource is no longer stale.
func (w *Watcher) caughtUp(rv string) {
	w.syncedOnce.Do(func() {
		// Logged first: whoever sees the resource synced finds the line.
		w.Log.Info("resource caught up: its watch resumed from the snapshot's resourceVersion and reached the apiserver's, no list needed",
			"snapshot", w.ResumeRV, "resourceVersion", rv)
		w.syncedAt.Store(time.Now().UnixNano())
		close(w.Synced)
		w.NoteFresh()
	})
}

// isExpired reports a 410 Gone: the resource version asked for has been
// compacted away, and a new list is the normal way on.
func isExpired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// The backoff between failed runs of list-and-watch: the delay doubles
// from retryInitial up to retryMax, each plus up to retryJitter of itself
// (so at most 10 s), and starts over only after a run whose watch stayed
// established for backoffResetAfter. That is as long as the longest delay,
// so a watch that keeps failing after working a while costs the apiserver
// no more than one that keeps failing at once: about one LIST and one
// WATCH per 10 s, per resource.
const (
	retryInitial      = 500 * time.Millisecond
	retryMax          = 8 * time.Second
	retryJitter       = 0.25
	backoffResetAfter = 10 * time.Second
)

func newBackoff() wait.Backoff {
	return wait.Backoff{Duration: retryInitial, Factor: 2, Jitter: retryJitter, Steps: 10, Cap: retryMax}
}

// lister's methods are the watcher's (see lister).

func (l lister) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.w.listWithContext(context.Background(), opts)
}

func (l lister) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.w.watchWithContext(context.Background(), opts)
}

func (l lister) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return l.w.listWithContext(ctx, opts)
}

func (l lister) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return l.w.watchWithContext(ctx, opts)
}
