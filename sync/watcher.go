package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
	compiled "github.com/iidp/metasync/internal/plan"
)

// watcher runs the watch of one resource entry and feeds its source in the
// indexer. It is the reflector's store: the reflector hands it projected
// objects, never raw ones.
type watcher struct {
	plan   *compiled.Resource
	log    *slog.Logger
	client rest.Interface
	src    *indexer.Source // set when the engine publishes the watcher
	// cluster checks the cluster against the snapshot's (see
	// Engine.checkCluster); set with client.
	cluster func(context.Context) (clusterVerdict, error)

	// Set by Engine.launch, under the engine's mu: cancel stops run, done
	// is closed when it has returned.
	cancel context.CancelFunc
	done   chan struct{}
	// reloaded: a reload started this watcher (ResourceStatus.Syncing
	// until its first list); inherited: it restarts a resource whose
	// previous watcher had synced, so that the indexes the two share
	// (kept) hold that one's answers until the first list. Set before
	// the watcher is published.
	reloaded, inherited bool
	kept                map[string]bool

	// restored: the resource's objects came from a snapshot (see
	// snapshot.go), and resumeRV is the resourceVersion its watch resumes
	// from ("" when the snapshot's data must be listed: restoredRelist).
	// Set before Start. Until the watch has caught up (synced is closed),
	// the resource is stale. dropped: the snapshot turned out to be of
	// another cluster, and its data was cleared (see Engine.checkCluster).
	restored, restoredRelist bool
	resumeRV                 string
	dropped                  atomic.Bool
	// carried: the source holds what a previous definition of the entry
	// answered, and this watcher has not listed yet (see inherit); nil
	// otherwise. Snapshots write it until the first list.
	carried *carried
	// restoredAt is when the snapshot the data came from was written;
	// staleFrom: a reload restarted a resource that was stale, whose data
	// this one answers with until its first list.
	restoredAt time.Time
	staleFrom  bool
	// loaded is closed once a restored source can be written (see
	// indexer.Source.Load); nil when not restored.
	loaded <-chan struct{}
	// rv is the resourceVersion of the last write to the source (an
	// event's, a list's or a bookmark's), stored after the write: what a
	// snapshot of the source resumes from.
	rv atomic.Pointer[string]

	synced     chan struct{} // closed after the first complete list
	syncedOnce gosync.Once
	syncedAt   atomic.Int64 // unix nanos of the first sync

	mu      gosync.Mutex
	lastErr error // the last list or watch error since a watch was last established
	// failingSince is the time of the first error since a watch was last
	// established: a successful list does not reset it, an established
	// watch does.
	failingSince time.Time
	listed       atomic.Int64 // objects decoded by the current list

	failures    atomic.Int64 // errors recorded by fail, ever
	established atomic.Int64 // unix nanos: the first watch established in the current run, 0 if none yet

	watches atomic.Int64 // watch requests that started
	gone    atomic.Bool  // the apiserver answers 404: the resource is not served (CRD deleted?)

	added, updated, deleted, relists, listErrors, watchErrors atomic.Int64
	// Requests that ended, and how long they took, in nanoseconds: lists
	// (all pages of one) and watches (from their start to their end).
	lists, listNanos, watchesEnded, watchNanos atomic.Int64
	ruleErrors                                 []atomic.Int64 // per index of the resource
	ruleLog                                    rate.Sometimes
}

// The contracts of client-go that a watcher fulfils for its reflector.
var (
	_ cache.ReflectorStore           = (*watcher)(nil)
	_ cache.ListerWatcherWithContext = (*watcher)(nil)
)

func newWatcher(plan *compiled.Resource, log *slog.Logger) *watcher {
	return &watcher{
		plan:       plan,
		log:        log.With("resource", plan.Name),
		synced:     make(chan struct{}),
		ruleErrors: make([]atomic.Int64, len(plan.Indexes)),
		ruleLog:    rate.Sometimes{First: 5, Interval: 30 * time.Second},
	}
}

// carried is the data a restarted resource holds from an earlier
// definition of its entry until its first list: def is the definition its
// objects were projected by, rv the resourceVersion they are as of, and
// relist whether a snapshot of it must be listed rather than resumed
// (def's data is not the current definition's, or it came so from a
// snapshot). The store keeps the indexes of the same name and lays the
// objects' entries out for the current definition.
//
// unverified: the data descends from a snapshot that no list has
// replaced since, and whose cluster may not have been checked: it is
// dropped with the snapshot's when that turns out to be another
// cluster's, and snapshotted to be listed, not resumed, unless the check
// found this cluster.
type carried struct {
	def                *compiled.Resource
	rv                 string
	relist, unverified bool
}

// inherit takes over the counts and the synced state of the halted
// watcher of the resource's previous definition, so that its metrics go on
// counting and its indexes, which keep that one's answers until the first
// list, do not read as "not known yet". Until then, snapshots keep what
// they answer (see carried).
func (w *watcher) inherit(old *watcher) {
	w.inherited = old.isSynced()
	w.staleFrom, w.restoredAt = old.stale(), old.restoredAt
	if rv := old.resourceVersion(); w.inherited && rv != "" {
		c := &carried{def: old.plan, rv: rv, relist: old.restoredRelist && !old.listed1(), unverified: old.warm() && !old.listed1()}
		if oc := old.carried; oc != nil && !old.listed1() {
			c = &carried{def: oc.def, rv: oc.rv, relist: oc.relist, unverified: oc.unverified}
		}
		c.relist = c.relist || !compiled.SameData(c.def, w.plan)
		w.carried = c
		w.rv.Store(&c.rv)
	}
	w.syncedAt.Store(old.syncedAt.Load())
	w.kept = map[string]bool{}
	for _, ix := range w.plan.Indexes {
		if old.indexSynced(ix.Name) && slices.ContainsFunc(old.plan.Indexes, func(was compiled.Index) bool { return was.Name == ix.Name }) {
			w.kept[ix.Name] = true
		}
	}
	// An index answers through its fallback and hints: it is kept only
	// when they are (one that a reload added is empty until the list).
	for _, ix := range w.plan.Indexes {
		for _, c := range []string{ix.Fallback, ix.Hints} {
			if c != "" && !w.kept[c] {
				delete(w.kept, ix.Name)
			}
		}
	}
	for _, c := range []struct{ to, from *atomic.Int64 }{
		{&w.added, &old.added}, {&w.updated, &old.updated}, {&w.deleted, &old.deleted},
		{&w.relists, &old.relists}, {&w.listErrors, &old.listErrors}, {&w.watchErrors, &old.watchErrors},
		{&w.watches, &old.watches}, {&w.failures, &old.failures},
		{&w.lists, &old.lists}, {&w.listNanos, &old.listNanos},
		{&w.watchesEnded, &old.watchesEnded}, {&w.watchNanos, &old.watchNanos},
	} {
		c.to.Store(c.from.Load())
	}
	for i, ix := range w.plan.Indexes {
		for j, was := range old.plan.Indexes {
			if was.Name == ix.Name {
				w.ruleErrors[i].Store(old.ruleErrors[j].Load())
			}
		}
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
	// The rules of an object read one Doc: an EndpointSlice is read once
	// for all its indexes.
	doc := compiled.Doc{JSON: raw}
	var keys, values []string
	// A fallback and hints share their index's key rule and limit: its
	// keys are evaluated once for the three.
	var keysOf *compiled.Rule
	var keysLim compiled.Limit
	var keysErr error
	keyBytes := 0
	for i, ix := range w.plan.Indexes {
		values = values[:0]
		lim := ix.Limit()
		if ix.Key != keysOf || lim != keysLim {
			keys, keyBytes = keys[:0], 0
			keysErr = ix.Key.EvalDoc(&doc, lim, func(s string) { keys = append(keys, s); keyBytes += len(s) })
			keysOf, keysLim = ix.Key, lim
		}
		valueBytes := 0
		err := keysErr
		if err == nil && len(keys) > 0 {
			if ix.Value == nil {
				values = append(values, key)
				valueBytes = len(key)
			} else {
				err = ix.Value.EvalDoc(&doc, lim, func(s string) { values = append(values, s); valueBytes += len(s) })
			}
		}
		if err == nil {
			// keys × values entries, each key written with each value.
			n, size := len(keys)*len(values), len(values)*keyBytes+len(keys)*valueBytes
			if n > ix.MaxEntries || size > ix.MaxBytes {
				err = fmt.Errorf("%d keys × %d values: %d entries of %d bytes", len(keys), len(values), n, size)
			}
		}
		if err != nil {
			var limit *compiled.LimitError
			if errors.As(err, &limit) || !errors.As(err, new(*compiled.ShapeError)) {
				err = fmt.Errorf("over maxEntriesPerObject (%d entries, %d bytes): %w; the object adds nothing to this index", ix.MaxEntries, ix.MaxBytes, err)
			}
			w.ruleError(i, key, err)
			o.skipped = append(o.skipped, fmt.Errorf("index %s: %w", ix.Public(), err))
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
		var over error
		o.ix.Payload, over = projectFields(&doc, w.plan.Fields)
		if over != nil {
			w.ruleLog.Do(func() {
				w.log.Warn("field left out of an object's projection", "object", key, "error", over.Error())
			})
		}
	}
	w.src.Prepare(&o.ix)
	return o
}

// projectFields builds the compact JSON object of the configured fields.
// A field whose rule yields more than compiled.FieldLimit is left out, and
// the last such error returned.
func projectFields(doc *compiled.Doc, fields []compiled.Field) (string, error) {
	raw := doc.JSON
	var over error
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
			// Bounded as an index is: a template of arrays yields every
			// combination. A field over the bound is left out.
			err := f.Rule.EvalDoc(doc, compiled.FieldLimit, func(s string) { vals = append(vals, s) })
			if errors.As(err, new(*compiled.LimitError)) {
				over = fmt.Errorf("field %s: %w", f.Name, err)
			}
			if err != nil || len(vals) == 0 {
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
	return b.String(), over
}

func (w *watcher) ruleError(i int, key string, err error) {
	w.ruleErrors[i].Add(1)
	w.ruleLog.Do(func() {
		w.log.Warn("rule skipped for an object", "index", w.plan.Indexes[i].Public(), "object", key, "error", err.Error())
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
	w.rv.Store(&o.rv)
	w.log.Debug("applied", "object", o.ix.Key, "resourceVersion", o.rv)
	return nil
}

// UpdateResourceVersion records the resourceVersion of a bookmark: the
// source is as of it (cache.ResourceVersionUpdater).
func (w *watcher) UpdateResourceVersion(rv string) { w.rv.Store(&rv) }

// resourceVersion returns the resourceVersion the source is as of, at
// least: every write before it is in the source.
func (w *watcher) resourceVersion() string {
	if p := w.rv.Load(); p != nil {
		return *p
	}
	return ""
}

func (w *watcher) Delete(obj any) error {
	w.deleted.Add(1)
	var key string
	var rv *string
	switch o := obj.(type) {
	case *object:
		key, rv = o.ix.Key, &o.rv
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
	if rv != nil {
		w.rv.Store(rv)
	}
	return nil
}

func (w *watcher) Replace(list []any, rv string) error {
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
	w.rv.Store(&rv)
	w.log.Debug("replaced", "objects", len(objs), "took", time.Since(start).String())
	w.relists.Add(1)
	w.syncedOnce.Do(func() {
		w.syncedAt.Store(time.Now().UnixNano())
		close(w.synced)
		msg := "resource synced"
		switch {
		case w.inherited:
			msg = "resource synced with its new definition"
		case w.warm():
			msg = "resource caught up by a list: the snapshot's resourceVersion could not be resumed; only the differences were applied"
		}
		w.log.Info(msg, "objects", len(objs), "resourceVersion", rv)
	})
	return nil
}

func (w *watcher) Resync() error { return nil }

// isSynced reports whether the resource has data to answer with: its
// first complete list is done, or, for a restarted resource, was done by
// its previous definition's watcher, or it was restored from a snapshot.
func (w *watcher) isSynced() bool {
	if (w.inherited && !w.dropped.Load()) || w.warm() {
		return true
	}
	return w.listed1()
}

// warm reports a resource restored from a snapshot whose data is still
// there (not dropped as another cluster's).
func (w *watcher) warm() bool { return w.restored && !w.dropped.Load() }

// stale reports a resource that answers from a snapshot and has not caught
// up with the apiserver yet.
func (w *watcher) stale() bool {
	return (w.warm() || w.staleFrom && !w.dropped.Load()) && !w.listed1()
}

// unverified reports data from a snapshot that no list has replaced yet:
// restored, or carried over a reload from such data.
func (w *watcher) unverified() bool {
	if w.listed1() || w.dropped.Load() {
		return false
	}
	return w.restored || w.carried != nil && w.carried.unverified
}

// indexSynced reports whether one index of the resource answers from a
// complete list: this watcher's, or, for an index that the previous
// definition had too, that one's. An index that a restart added (or moved
// here from another resource) is empty until this watcher's first list.
func (w *watcher) indexSynced(index string) bool {
	return w.listed1() || w.kept[index] && !w.dropped.Load() || w.warm()
}

// listed1 reports whether this watcher's first complete list is done, or,
// for a restored resource, its watch has caught up (see resume).
func (w *watcher) listed1() bool {
	select {
	case <-w.synced:
		return true
	default:
		return false
	}
}

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
	defer func() {
		if ctx.Err() == nil {
			w.lists.Add(1)
			w.listNanos.Add(int64(time.Since(start)))
		}
	}()
	body, err := w.request(&opts).Stream(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err // a stop or a resync, not trouble
		}
		w.checkGone(err)
		w.listErrors.Add(1)
		w.fail(fmt.Errorf("list: %w", err))
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
		if ctx.Err() != nil {
			return nil, err
		}
		w.listErrors.Add(1)
		w.fail(fmt.Errorf("list: %w", err))
		return nil, err
	}
	// A list that works does not clear the error: the resource is fresh
	// again only once a watch is established (see trackedWatch).
	return list, nil
}

func (w *watcher) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	wi, err := w.request(&opts).Watch(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err // a stop or a resync, not trouble
		}
		w.checkGone(err)
		w.watchErrors.Add(1)
		w.fail(fmt.Errorf("watch: %w", err))
		return nil, err
	}
	w.watches.Add(1)
	w.log.Debug("watch started", "resourceVersion", opts.ResourceVersion)
	return w.track(ctx, wi), nil
}

// checkGone clears the resource's keys when the apiserver stops serving it
// (its CRD was deleted, say): nothing can be known of it any more, and
// stale answers would route calls to what is gone. The next successful
// list brings everything back.
func (w *watcher) checkGone(err error) {
	if !apierrors.IsNotFound(err) || w.gone.Swap(true) {
		return
	}
	if !w.isSynced() {
		w.log.Warn("resource not served by the apiserver (is its CRD installed? is resource: its plural?): not synced, retrying", "gvr", w.plan.GVR.String(), "error", err.Error())
		return
	}
	w.src.Replace(nil)
	// Its objects are gone from the source, not from the cluster's
	// history: a snapshot must not resume from here (it leaves the
	// resource out until the next list).
	w.rv.Store(nil)
	w.log.Warn("resource not served any more: its keys are cleared until it returns", "gvr", w.plan.GVR.String(), "error", err.Error())
}

// IsWatchListSemanticsUnSupported keeps the reflector on LIST then WATCH.
func (w *watcher) IsWatchListSemanticsUnSupported() bool { return true }

// establishedAfter is how long a watch must stay open without an error to
// count as established, whether or not it delivers events.
const establishedAfter = time.Second

// trackedWatch hands the events of one watch request to the reflector and
// tells the watcher how the watch went. client-go's reflector returns no
// error for a watch that ends with an ERROR event or ends at once (it lists
// again), so without this the watcher would see neither.
type trackedWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  gosync.Once
}

func (t *trackedWatch) ResultChan() <-chan watch.Event { return t.out }

func (t *trackedWatch) Stop() {
	t.once.Do(func() {
		close(t.stop)
		t.inner.Stop()
	})
}

func (t *trackedWatch) stopped() bool {
	select {
	case <-t.stop:
		return true
	default:
		return false
	}
}

// track wraps a watch that the apiserver accepted. The watch is
// established once it stays open establishedAfter without an ERROR event;
// an ERROR event, or an end before it was established, is a failure.
// Neither counts while ctx ends or the reflector stops the watch: a stop
// or a resync.
func (w *watcher) track(ctx context.Context, inner watch.Interface) watch.Interface {
	t := &trackedWatch{inner: inner, out: make(chan watch.Event), stop: make(chan struct{})}
	go w.follow(ctx, t)
	return t
}

func (w *watcher) follow(ctx context.Context, t *trackedWatch) {
	defer close(t.out)
	started := time.Now()
	defer func() {
		w.watchesEnded.Add(1)
		w.watchNanos.Add(int64(time.Since(started)))
	}()
	timer := time.NewTimer(establishedAfter)
	defer timer.Stop()
	established, failed := false, false
	stopping := func() bool { return ctx.Err() != nil || t.stopped() }
	in := t.inner.ResultChan()
	for {
		select {
		case ev, ok := <-in:
			if !ok {
				if !established && !failed && !stopping() {
					w.watchErrors.Add(1)
					// The same text every time: a changed message is logged again.
					w.fail(fmt.Errorf("watch: ended within %s of its start", establishedAfter))
				}
				return
			}
			// Events do not establish a watch by themselves: one that
			// delivers an event and then fails, over and over, never
			// keeps working, and the resource must go stale.
			if ev.Type == watch.Error && !failed && !stopping() {
				failed = true
				w.watchErrors.Add(1)
				w.fail(fmt.Errorf("watch: %w", apierrors.FromObject(ev.Object)))
			}
			select {
			case t.out <- ev:
			case <-t.stop:
				return
			}
		case <-timer.C:
			if !failed {
				established = true
				w.watchEstablished()
			}
		case <-t.stop:
			return
		}
	}
}

// fail records a list or watch error. Status shows it until a watch is
// established again, and the resource turns stale once that has not
// happened for staleAfter since the first error.
func (w *watcher) fail(err error) {
	w.failures.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lastErr == nil || w.lastErr.Error() != err.Error() {
		level := slog.LevelWarn
		if isExpired(err) {
			level = slog.LevelInfo // compaction: normal, the reflector lists again
		}
		w.log.Log(context.Background(), level, "watch trouble", "error", err.Error())
	}
	if w.failingSince.IsZero() {
		w.failingSince = time.Now()
	}
	w.lastErr = err
}

// watchEstablished records a watch that works: the resource is fresh.
func (w *watcher) watchEstablished() {
	now := time.Now()
	w.established.CompareAndSwap(0, now.UnixNano())
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lastErr != nil {
		w.log.Info("watch recovered", "failedFor", now.Sub(w.failingSince).Round(time.Millisecond).String())
	}
	w.lastErr, w.failingSince = nil, time.Time{}
}

// caughtUp records a resumed watch that has delivered the apiserver's
// state as of when resume asked for it: the resource is no longer stale.
func (w *watcher) caughtUp(rv string) {
	w.syncedOnce.Do(func() {
		// Logged first: whoever sees the resource synced finds the line.
		w.log.Info("resource caught up: its watch resumed from the snapshot's resourceVersion and reached the apiserver's, no list needed",
			"snapshot", w.resumeRV, "resourceVersion", rv)
		w.syncedAt.Store(time.Now().UnixNano())
		close(w.synced)
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

// run keeps the resource listed and watched until ctx ends. A resync period
// relists the resource that often.
//
// A run (one list, then watches) that ends for any other reason than a
// resync or ctx is a failure, even when the reflector returns nil, as it
// does for a watch that ends with an ERROR event or at once: the next run
// waits for the backoff. A 410 Gone (compaction) is relisted at once, but
// only as the first failure since the backoff was reset.
func (w *watcher) run(ctx context.Context) {
	logger := logr.FromSlogHandler(w.log.Handler())
	r := cache.NewReflectorWithOptions(w, &object{}, w, cache.ReflectorOptions{
		Name:            w.plan.Name,
		TypeDescription: w.plan.GVR.String(),
		Logger:          &logger,
	})
	if w.resumeRV != "" && !w.resume(ctx) {
		return
	}
	if w.resumeRV == "" && w.unverified() && w.cluster != nil {
		// Data of a snapshot that this watcher lists, not resumes (carried
		// over a reload, or to be listed): the cluster check still decides
		// whether it is dropped at once, and what later snapshots record.
		// Best effort: the list replaces it anyway.
		checkCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, _ = w.cluster(checkCtx)
		cancel()
	}
	delay := newBackoff()
	streak := 0 // failed runs since the backoff was reset
	for ctx.Err() == nil {
		runCtx, cancel := context.WithCancel(ctx)
		var resynced atomic.Bool
		var timer gosync.WaitGroup
		if w.plan.Resync > 0 {
			timer.Go(func() {
				w.resyncAfter(runCtx, func() {
					resynced.Store(true)
					cancel()
				})
			})
		}
		w.established.Store(0)
		failures := w.failures.Load()
		err := r.ListAndWatchWithContext(runCtx)
		cancel()
		timer.Wait()
		if ctx.Err() != nil {
			return // a stop is not trouble
		}
		if at := w.established.Load(); at != 0 && time.Since(time.Unix(0, at)) >= backoffResetAfter {
			delay, streak = newBackoff(), 0
		}
		if resynced.Load() {
			continue // a resync: list again
		}
		// List and watch errors are recorded where they happen, without the
		// reflector's wrapping; record the others.
		if w.failures.Load() == failures {
			if err == nil {
				err = errors.New("watch ended")
			}
			w.fail(err)
		}
		streak++
		if streak == 1 && isExpired(w.lastError()) {
			continue // compaction: list again at once, once
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay.Step()):
		}
	}
}

// lastError returns the last error since a watch was last established.
func (w *watcher) lastError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// resyncAfter calls resync once a resync period has passed after a
// complete list, to end the current list-and-watch so that run lists
// again. A list that takes longer than the period is never cut short.
func (w *watcher) resyncAfter(ctx context.Context, resync func()) {
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
			resync()
			return
		}
		t.Reset(w.plan.Resync)
	}
}

// status reports the watcher's state. A resource is ready once it has
// synced, for as long as it has not gone staleAfter without an established
// watch since its first error: a list that works while the watch keeps
// failing does not make it fresh.
func (w *watcher) status(snap *indexer.Snapshot, staleAfter time.Duration) ResourceStatus {
	st := ResourceStatus{
		Name:         w.plan.Name,
		GVR:          w.plan.GVR.String(),
		Namespace:    w.plan.Namespace,
		Objects:      snap.ObjectCount(w.src),
		Added:        w.added.Load(),
		Updated:      w.updated.Load(),
		Deleted:      w.deleted.Load(),
		Relists:      w.relists.Load(),
		ListErrors:   w.listErrors.Load(),
		WatchErrors:  w.watchErrors.Load(),
		Watches:      w.watches.Load(),
		Listed:       w.listed.Load(),
		Lists:        w.lists.Load(),
		ListSeconds:  time.Duration(w.listNanos.Load()).Seconds(),
		WatchesEnded: w.watchesEnded.Load(),
		WatchSeconds: time.Duration(w.watchNanos.Load()).Seconds(),
		RuleErrors:   map[string]int64{},
	}
	if w.isSynced() {
		st.Synced = true
		if at := w.syncedAt.Load(); at != 0 {
			st.SyncedAt = time.Unix(0, at)
		}
	}
	st.Stale = w.stale()
	for i, ix := range w.plan.Indexes {
		st.RuleErrors[ix.Public()] += w.ruleErrors[i].Load()
	}
	w.mu.Lock()
	if w.lastErr != nil {
		st.Error = w.lastErr.Error()
		st.ErrorSince = w.failingSince
	}
	w.mu.Unlock()
	// A resource that a reload started is syncing until its first list,
	// for as long as that can still come: not once its resource is not
	// served, nor once it has failed for staleAfter.
	failingLong := st.Error != "" && time.Since(st.ErrorSince) >= staleAfter
	st.Syncing = w.reloaded && !w.listed1() && !(w.gone.Load() && st.Error != "") && !failingLong
	switch {
	case w.gone.Load() && st.Error != "":
		st.Reason = "not served: " + st.Error
	case st.Stale && st.Error != "":
		st.Reason = "stale: answering from a snapshot, the apiserver not caught up with: " + st.Error
	case st.Stale:
		st.Reason = "stale: answering from a snapshot while its watch resumes"
	case st.Syncing && !st.Synced && st.Error != "":
		st.Reason = "syncing, added by a reload: " + st.Error
	case st.Syncing && !st.Synced:
		st.Reason = "syncing, added by a reload: first list in progress"
	case !st.Synced && st.Error != "":
		st.Reason = "not synced: " + st.Error
	case !st.Synced:
		st.Reason = "not synced: first list in progress"
	case failingLong:
		st.Reason = fmt.Sprintf("watch failing for %s, no established watch: %s", time.Since(st.ErrorSince).Round(time.Second), st.Error)
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
