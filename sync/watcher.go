package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/tidwall/gjson"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/iidp/metasync/indexer"
	"github.com/iidp/metasync/schema"
)

// watcher runs the watch of one resource entry and feeds its source in the
// indexer. It is the reflector's store: the reflector hands it projected
// objects, never raw ones.
type watcher struct {
	plan   *schema.ResourcePlan
	log    *slog.Logger
	client rest.Interface
	src    *indexer.Source
	store  *indexer.Store

	synced     chan struct{} // closed after the first complete list
	syncedOnce gosync.Once
	syncedAt   atomic.Int64 // unix nanos of the first sync

	mu           gosync.Mutex
	lastErr      error
	failingSince time.Time    // first error since the watch last worked
	listed       atomic.Int64 // objects decoded by the current list

	watches atomic.Int64 // watch requests that started
	gone    atomic.Bool  // the apiserver answers 404: the resource is not served (CRD deleted?)

	added, updated, deleted, relists, listErrors, watchErrors atomic.Int64
	ruleErrors                                                []atomic.Int64 // per index of the resource
	ruleLog                                                   rate.Sometimes
}

func newWatcher(plan *schema.ResourcePlan, client rest.Interface, store *indexer.Store, log *slog.Logger) *watcher {
	return &watcher{
		plan:       plan,
		log:        log.With("resource", plan.Name),
		client:     client,
		store:      store,
		src:        store.Source(plan.Name),
		synced:     make(chan struct{}),
		ruleErrors: make([]atomic.Int64, len(plan.Indexes)),
		ruleLog:    rate.Sometimes{First: 5, Interval: 30 * time.Second},
	}
}

// project reduces one object's JSON to its object key, entries and payload.
// It never fails: a rule that cannot be evaluated on this object is counted
// and the object contributes nothing to that index.
func (w *watcher) project(raw string) *object {
	meta := gjson.GetMany(raw, "metadata.name", "metadata.namespace", "metadata.resourceVersion")
	// raw may be reused once project returns: everything kept is copied,
	// the entries by Prepare into the indexer's encoding.
	o := &object{rv: strings.Clone(meta[2].Str)}
	key := meta[0].Str // Prepare copies it
	if meta[1].Str != "" {
		key = meta[1].Str + "/" + meta[0].Str
	}
	o.ix.Key = key
	o.ix.Entries = make([][]indexer.Entry, len(w.plan.Indexes))
	var keys, values []string
	for i, ix := range w.plan.Indexes {
		keys, values = keys[:0], values[:0]
		err := ix.Key.Eval(raw, func(s string) { keys = append(keys, s) })
		if err == nil && len(keys) > 0 {
			if ix.Value == nil {
				values = append(values, key)
			} else {
				err = ix.Value.Eval(raw, func(s string) { values = append(values, s) })
			}
		}
		if err != nil {
			w.ruleError(i, key, err)
			continue
		}
		if len(keys) == 0 || len(values) == 0 {
			continue
		}
		es := make([]indexer.Entry, 0, len(keys)*len(values))
		for _, k := range keys {
			for _, v := range values {
				es = append(es, indexer.Entry{Key: k, Value: v})
			}
		}
		o.ix.Entries[i] = es
	}
	if len(w.plan.Fields) > 0 {
		o.ix.Payload = projectFields(raw, w.plan.Fields)
	}
	w.src.Prepare(&o.ix)
	return o
}

// projectFields builds the compact JSON object of the configured fields.
func projectFields(raw string, fields []schema.FieldRule) string {
	var b strings.Builder
	b.WriteByte('{')
	n := 0
	for _, f := range fields {
		var value string
		if path, ok := f.Rule.SinglePath(); ok {
			res := gjson.Get(raw, path)
			if !res.Exists() {
				continue
			}
			value = res.Raw
		} else {
			var vals []string
			if err := f.Rule.Eval(raw, func(s string) { vals = append(vals, s) }); err != nil || len(vals) == 0 {
				continue
			}
			if len(vals) == 1 {
				value = strconv.Quote(vals[0])
			} else {
				quoted := make([]string, len(vals))
				for i, v := range vals {
					quoted[i] = strconv.Quote(v)
				}
				value = "[" + strings.Join(quoted, ",") + "]"
			}
		}
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(f.Name))
		b.WriteByte(':')
		b.WriteString(value)
		n++
	}
	b.WriteByte('}')
	return b.String()
}

func (w *watcher) ruleError(i int, key string, err error) {
	w.ruleErrors[i].Add(1)
	w.ruleLog.Do(func() {
		w.log.Warn("rule skipped for an object", "index", w.plan.Indexes[i].Name, "object", key, "error", err.Error())
	})
}

// --- cache.ReflectorStore: the reflector writes here ---

func (w *watcher) Add(obj any) error {
	w.added.Add(1)
	return w.put(obj)
}

func (w *watcher) Update(obj any) error {
	w.updated.Add(1)
	return w.put(obj)
}

func (w *watcher) put(obj any) error {
	o, ok := obj.(*object)
	if !ok {
		return fmt.Errorf("unexpected %T in the watch of %s", obj, w.plan.Name)
	}
	tx := w.src.Begin()
	tx.Put(o.ix)
	tx.Commit()
	w.log.Debug("applied", "object", o.ix.Key, "resourceVersion", o.rv)
	return nil
}

func (w *watcher) Delete(obj any) error {
	w.deleted.Add(1)
	var key string
	switch o := obj.(type) {
	case *object:
		key = o.ix.Key
	case cache.DeletedFinalStateUnknown:
		key = o.Key
	case *cache.DeletedFinalStateUnknown:
		key = o.Key
	default:
		return fmt.Errorf("unexpected %T deleted in the watch of %s", obj, w.plan.Name)
	}
	tx := w.src.Begin()
	tx.Delete(key)
	tx.Commit()
	return nil
}

func (w *watcher) Replace(list []any, _ string) error {
	objs := make([]indexer.Object, 0, len(list))
	for _, it := range list {
		o, ok := it.(*object)
		if !ok {
			return fmt.Errorf("unexpected %T in the list of %s", it, w.plan.Name)
		}
		objs = append(objs, o.ix)
	}
	start := time.Now()
	w.src.Replace(objs)
	w.log.Debug("replaced", "objects", len(objs), "took", time.Since(start).String())
	w.relists.Add(1)
	w.syncedOnce.Do(func() {
		w.syncedAt.Store(time.Now().UnixNano())
		close(w.synced)
		w.log.Info("resource synced", "objects", len(objs))
	})
	return nil
}

func (w *watcher) Resync() error { return nil }

// --- cache.ListerWatcher: raw JSON in, projected objects out ---

func (w *watcher) request(opts *metav1.ListOptions) *rest.Request {
	opts.LabelSelector = w.plan.LabelSelector
	opts.FieldSelector = w.plan.FieldSelector
	req := w.client.Get().Resource(w.plan.GVR.Resource).VersionedParams(opts, metav1.ParameterCodec)
	if w.plan.Namespace != "" {
		req = req.Namespace(w.plan.Namespace)
	}
	return req
}

func (w *watcher) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	if opts.Continue == "" {
		w.listed.Store(0)
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
	body, err := w.request(&opts).Stream(ctx)
	if err != nil {
		w.checkGone(err)
		w.listErrors.Add(1)
		w.setErr(fmt.Errorf("list: %w", err))
		return nil, err
	}
	list, err := streamList(body, w.project)
	body.Close()
	if list != nil {
		w.listed.Add(int64(len(list.Items)))
		w.log.Debug("list page", "objects", len(list.Items), "took", time.Since(start).String())
	}
	w.gone.Store(false)
	if err != nil {
		w.setErr(fmt.Errorf("list: %w", err))
		return nil, err
	}
	w.setErr(nil)
	return list, nil
}

func (w *watcher) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	wi, err := w.request(&opts).Watch(ctx)
	if err != nil {
		w.checkGone(err)
		w.watchErrors.Add(1)
		w.setErr(fmt.Errorf("watch: %w", err))
		return nil, err
	}
	w.watches.Add(1)
	w.log.Debug("watch started", "resourceVersion", opts.ResourceVersion)
	w.setErr(nil)
	return wi, nil
}

// checkGone clears the resource's keys when the apiserver stops serving it
// (its CRD was deleted, say): nothing can be known of it any more, and
// stale answers would route calls to what is gone. The next successful
// list brings everything back.
func (w *watcher) checkGone(err error) {
	if !apierrors.IsNotFound(err) || w.gone.Swap(true) {
		return
	}
	w.src.Replace(nil)
	w.log.Warn("resource not served any more: its keys are cleared until it returns", "error", err.Error())
}

// IsWatchListSemanticsUnSupported keeps the reflector on LIST then WATCH.
func (w *watcher) IsWatchListSemanticsUnSupported() bool { return true }

func (w *watcher) setErr(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil && (w.lastErr == nil || w.lastErr.Error() != err.Error()) {
		w.log.Warn("watch trouble", "error", err.Error())
	}
	if err == nil && w.lastErr != nil {
		w.log.Info("watch recovered")
	}
	switch {
	case err == nil:
		w.failingSince = time.Time{}
	case w.lastErr == nil:
		w.failingSince = time.Now()
	}
	w.lastErr = err
}

// run keeps the resource listed and watched until ctx ends. A resync period
// relists the resource that often.
func (w *watcher) run(ctx context.Context) {
	logger := logr.FromSlogHandler(w.log.Handler())
	r := cache.NewReflectorWithOptions(w, &object{}, w, cache.ReflectorOptions{
		Name:            w.plan.Name,
		TypeDescription: w.plan.GVR.String(),
		Logger:          &logger,
	})
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 6, Cap: 10 * time.Second}
	delay := backoff
	for ctx.Err() == nil {
		runCtx, cancel := context.WithCancel(ctx)
		var timer gosync.WaitGroup
		if w.plan.Resync > 0 {
			timer.Go(func() { w.resyncAfter(runCtx, cancel) })
		}
		listed := w.relists.Load()
		err := r.ListAndWatchWithContext(runCtx)
		cancel()
		timer.Wait()
		if ctx.Err() != nil {
			return
		}
		if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			delay = backoff
			continue // a resync: list again
		}
		// List and watch errors are recorded where they happen, without the
		// reflector's wrapping; keep those.
		w.mu.Lock()
		recorded := w.lastErr != nil
		w.mu.Unlock()
		if !recorded {
			w.setErr(err)
		}
		if w.relists.Load() > listed {
			delay = backoff // this run got as far as a complete list
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay.Step()):
		}
	}
}

// resyncAfter ends the current list-and-watch once a resync period has
// passed after a complete list, so that run lists again. A list that takes
// longer than the period is never cut short.
func (w *watcher) resyncAfter(ctx context.Context, cancel context.CancelFunc) {
	listed := w.relists.Load()
	t := time.NewTimer(w.plan.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if now := w.relists.Load(); now > listed {
			cancel()
			return
		}
		t.Reset(w.plan.Resync)
	}
}

// status reports the watcher's state. A resource is ready once it has
// synced, for as long as its list/watch has not been failing for longer
// than staleAfter.
func (w *watcher) status(snap *indexer.Snapshot, staleAfter time.Duration) ResourceStatus {
	st := ResourceStatus{
		Name:        w.plan.Name,
		GVR:         w.plan.GVR.String(),
		Namespace:   w.plan.Namespace,
		Objects:     snap.ObjectCount(w.src),
		Added:       w.added.Load(),
		Updated:     w.updated.Load(),
		Deleted:     w.deleted.Load(),
		Relists:     w.relists.Load(),
		ListErrors:  w.listErrors.Load(),
		WatchErrors: w.watchErrors.Load(),
		Watches:     w.watches.Load(),
		Listed:      w.listed.Load(),
		RuleErrors:  map[string]int64{},
	}
	select {
	case <-w.synced:
		st.Synced = true
		st.SyncedAt = time.Unix(0, w.syncedAt.Load())
	default:
	}
	for i, ix := range w.plan.Indexes {
		st.RuleErrors[ix.Name] = w.ruleErrors[i].Load()
	}
	w.mu.Lock()
	if w.lastErr != nil {
		st.Error = w.lastErr.Error()
		st.ErrorSince = w.failingSince
	}
	w.mu.Unlock()
	switch {
	case w.gone.Load() && st.Error != "":
		st.Reason = "not served: " + st.Error
	case !st.Synced && st.Error != "":
		st.Reason = "not synced: " + st.Error
	case !st.Synced:
		st.Reason = "not synced: first list in progress"
	case st.Error != "" && time.Since(st.ErrorSince) >= staleAfter:
		st.Reason = fmt.Sprintf("watch failing for %s: %s", time.Since(st.ErrorSince).Round(time.Second), st.Error)
	default:
		st.Ready = true
	}
	return st
}

// List is ListWithContext without a context, for cache.ListerWatcher.
func (w *watcher) List(opts metav1.ListOptions) (runtime.Object, error) {
	return w.ListWithContext(context.Background(), opts)
}

// Watch is WatchWithContext without a context, for cache.ListerWatcher.
func (w *watcher) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return w.WatchWithContext(context.Background(), opts)
}
