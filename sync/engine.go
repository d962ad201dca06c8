// Package sync is metasync's engine: one watch per configured resource,
// each object projected to the fields its rules need, and the results fed
// into the named reverse indexes of package indexer.
//
// The package name shadows the standard library's sync; import it under
// another name where both are needed:
//
//	import msync "github.com/iidp/metasync/sync"
//
// An Engine is built from a compiled schema.Plan and a *rest.Config. Start
// runs every watch until its context ends; WaitForSync waits for the first
// complete list of every resource; Lookup, Resolve and Objects read the
// indexes from memory, without locks, from any number of goroutines.
package sync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/indexer"
	mschema "github.com/iidp/metasync/schema"
)

// Options tune an Engine.
type Options struct {
	// Logger receives the engine's logs, client-go's reflector logs
	// included. Default: slog.Default().
	Logger *slog.Logger
	// StaleAfter is how long a synced resource may go without an
	// established watch, from its first list or watch error, before it
	// stops being ready. A list that works while the watch keeps failing
	// does not make the resource fresh again. Default 30s.
	StaleAfter time.Duration
}

// DefaultStaleAfter is the default of Options.StaleAfter.
const DefaultStaleAfter = 30 * time.Second

// Engine keeps the indexes of a Plan in sync with a cluster.
type Engine struct {
	plan     *mschema.Plan
	log      *slog.Logger
	store    *indexer.Store
	watchers []*watcher
	byName   map[string]*watcher // resource name
	byIndex  map[string]*watcher // index name
	chains   map[string][]indexer.Index
	started  atomic.Bool

	staleAfter time.Duration
}

// ResourceStatus is the state of one resource entry.
type ResourceStatus struct {
	Name      string `json:"name"`
	GVR       string `json:"gvr"`
	Namespace string `json:"namespace,omitempty"`
	// Ready is Synced, and the resource has not gone longer than
	// Options.StaleAfter without an established watch since its first
	// error; Reason says why not.
	Ready    bool      `json:"ready"`
	Reason   string    `json:"reason,omitempty"`
	Synced   bool      `json:"synced"`
	SyncedAt time.Time `json:"syncedAt,omitzero"`
	Objects  int       `json:"objects"`
	// Error is the last list or watch error, "" once a watch is
	// established again (it stayed open a second without an error);
	// a list that works does not clear it.
	Error string `json:"error,omitempty"`
	// ErrorSince is when the trouble began: the first error since a watch
	// was last established.
	ErrorSince time.Time `json:"errorSince,omitzero"`
	// Events applied, by type, and complete lists (relists included).
	Added   int64 `json:"added"`
	Updated int64 `json:"updated"`
	Deleted int64 `json:"deleted"`
	Relists int64 `json:"relists"`
	// Failed list and watch requests; WatchErrors also counts watches
	// that ended with an ERROR event or before they were established.
	ListErrors  int64 `json:"listErrors"`
	WatchErrors int64 `json:"watchErrors"`
	// Watches counts the watch requests that started (restarts included).
	Watches int64 `json:"watches"`
	// Listed is the number of objects decoded by the current or last list,
	// to show progress of a long initial sync.
	Listed int64 `json:"listed"`
	// RuleErrors counts, per index, objects whose rule could not be
	// evaluated (an object where a string was wanted, say).
	RuleErrors map[string]int64 `json:"ruleErrors"`
}

// New builds an Engine. It checks the plan against nothing remote: a
// missing CRD shows up later, in the resource's status.
func New(plan *mschema.Plan, cfg *rest.Config, opts Options) (*Engine, error) {
	if plan == nil || cfg == nil {
		return nil, errors.New("sync.New needs a plan and a rest config")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	var specs []indexer.SourceSpec
	for _, r := range plan.Resources() {
		// Object keys per index key serve typed access, which needs fields.
		spec := indexer.SourceSpec{Name: r.Name, Objects: len(r.Fields) > 0}
		for _, ix := range r.Indexes {
			spec.Indexes = append(spec.Indexes, ix.Name)
		}
		specs = append(specs, spec)
	}
	store, err := indexer.New(specs...)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		plan:    plan,
		log:     log,
		store:   store,
		byName:  map[string]*watcher{},
		byIndex: map[string]*watcher{},
		chains:  map[string][]indexer.Index{},

		staleAfter: opts.StaleAfter,
	}
	if e.staleAfter <= 0 {
		e.staleAfter = DefaultStaleAfter
	}

	cfg = rest.CopyConfig(cfg)
	cfg.AcceptContentTypes = "application/json"
	cfg.ContentType = "application/json"
	if cfg.UserAgent == "" {
		cfg.UserAgent = "metasync"
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("build HTTP client: %w", err)
	}
	for _, r := range plan.Resources() {
		w := newWatcher(r, nil, store, log)
		rc := rest.CopyConfig(cfg)
		gv := schema.GroupVersion{Group: r.GVR.Group, Version: r.GVR.Version}
		rc.GroupVersion = &gv
		rc.APIPath = "/apis"
		if gv.Group == "" {
			rc.APIPath = "/api"
		}
		rc.NegotiatedSerializer = &codec{project: w.project}
		client, err := rest.RESTClientForConfigAndClient(rc, httpClient)
		if err != nil {
			return nil, fmt.Errorf("resource %s: %w", r.Name, err)
		}
		w.client = client
		e.watchers = append(e.watchers, w)
		e.byName[r.Name] = w
		for _, ix := range r.Indexes {
			e.byIndex[ix.Name] = w
		}
	}
	for _, ch := range plan.Chains() {
		var steps []indexer.Index
		for _, name := range ch.Indexes {
			ix, _ := store.Index(name)
			steps = append(steps, ix)
		}
		e.chains[ch.Name] = steps
	}
	return e, nil
}

// Start runs one watch per resource and blocks until ctx ends and every
// goroutine it started has exited. It returns an error only when the engine
// was started before.
func (e *Engine) Start(ctx context.Context) error {
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("engine already started")
	}
	e.log.Info("engine starting", "resources", len(e.watchers))
	var wg gosync.WaitGroup
	for _, w := range e.watchers {
		wg.Go(func() { w.run(ctx) })
	}
	<-ctx.Done()
	wg.Wait()
	e.log.Info("engine stopped")
	return nil
}

// WaitForSync blocks until every resource has completed its first list, or
// ctx ends; then the error names the resources still waiting and why.
func (e *Engine) WaitForSync(ctx context.Context) error {
	for _, w := range e.watchers {
		select {
		case <-w.synced:
		case <-ctx.Done():
			var waiting []string
			for _, st := range e.Status() {
				if !st.Synced {
					reason := st.Error
					if reason == "" {
						reason = "no list completed yet"
					}
					waiting = append(waiting, st.Name+" ("+reason+")")
				}
			}
			return fmt.Errorf("not synced: %s: %w", strings.Join(waiting, ", "), ctx.Err())
		}
	}
	return nil
}

// Synced reports whether every resource has completed its first list.
func (e *Engine) Synced() bool {
	for _, w := range e.watchers {
		select {
		case <-w.synced:
		default:
			return false
		}
	}
	return true
}

// Ready reports whether every resource is ready (see ResourceStatus.Ready).
func (e *Engine) Ready() bool {
	for _, st := range e.Status() {
		if !st.Ready {
			return false
		}
	}
	return true
}

// Status returns the state of every resource, in config order.
func (e *Engine) Status() []ResourceStatus {
	snap := e.store.Snapshot()
	out := make([]ResourceStatus, len(e.watchers))
	for i, w := range e.watchers {
		out[i] = w.status(snap, e.staleAfter)
	}
	return out
}

// Plan returns the plan the engine runs.
func (e *Engine) Plan() *mschema.Plan { return e.plan }

// Store returns the engine's indexes, for callers that want handles
// (indexer.Index) or consistent snapshots.
func (e *Engine) Store() *indexer.Store { return e.store }

// Lookup returns the values of key in the named index: distinct, sorted,
// nil when none. The slice is shared and must not be modified. An unknown
// index yields nil; HasIndex tells the two apart.
func (e *Engine) Lookup(index, key string) []string { return e.store.Lookup(index, key) }

// HasIndex reports whether the index is configured.
func (e *Engine) HasIndex(index string) bool {
	_, ok := e.byIndex[index]
	return ok
}

// HasChain reports whether the chain is configured.
func (e *Engine) HasChain(chain string) bool {
	_, ok := e.chains[chain]
	return ok
}

// IndexResource returns the name of the resource that feeds an index.
func (e *Engine) IndexResource(index string) (string, bool) {
	w, ok := e.byIndex[index]
	if !ok {
		return "", false
	}
	return w.plan.Name, true
}

// IndexSynced reports whether the resource that feeds an index has
// completed a list since the engine started: until then an empty answer
// means "not known yet", not "no values". An unknown index is not synced.
func (e *Engine) IndexSynced(index string) bool {
	w, ok := e.byIndex[index]
	return ok && w.isSynced()
}

// ChainSynced reports whether every index of a chain is synced (see
// IndexSynced).
func (e *Engine) ChainSynced(chain string) bool {
	for _, ch := range e.plan.Chains() {
		if ch.Name != chain {
			continue
		}
		for _, index := range ch.Indexes {
			if !e.IndexSynced(index) {
				return false
			}
		}
		return true
	}
	return false
}

// Resolve follows the named chain from key, on one consistent snapshot,
// and returns the distinct values of its last index, sorted; nil when none
// or the chain is unknown.
func (e *Engine) Resolve(chain, key string) []string {
	steps, ok := e.chains[chain]
	if !ok {
		return nil
	}
	return e.store.Snapshot().Resolve(steps, key)
}

// Keys returns every key of the named index, sorted. The slice is shared
// by every caller until the index changes: do not modify it.
func (e *Engine) Keys(index string) []string {
	ix, ok := e.store.Index(index)
	if !ok {
		return nil
	}
	return e.store.Snapshot().Keys(ix)
}

// Objects decodes, into T, the projected fields (the resource's `fields`)
// of every object behind key in the named index, ordered by object key. T
// is a struct with json tags matching the field names.
func Objects[T any](e *Engine, index, key string) ([]T, error) {
	w, ok := e.byIndex[index]
	if !ok {
		return nil, fmt.Errorf("unknown index %q", index)
	}
	if len(w.plan.Fields) == 0 {
		return nil, fmt.Errorf("resource %s declares no fields", w.plan.Name)
	}
	ix, _ := e.store.Index(index)
	snap := e.store.Snapshot()
	keys := snap.Objects(ix, key)
	out := make([]T, 0, len(keys))
	for _, ok := range keys {
		p, found := snap.Payload(w.src, ok)
		if !found {
			continue
		}
		var v T
		if err := json.Unmarshal([]byte(p.(string)), &v); err != nil {
			return nil, fmt.Errorf("decode fields of %s: %w", ok, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// Object decodes the projected fields of one object of a resource, by
// object key (namespace/name, or name).
func Object[T any](e *Engine, resource, objectKey string) (T, bool, error) {
	var v T
	w, ok := e.byName[resource]
	if !ok {
		return v, false, fmt.Errorf("unknown resource %q", resource)
	}
	p, found := e.store.Snapshot().Payload(w.src, objectKey)
	if !found {
		return v, false, nil
	}
	if err := json.Unmarshal([]byte(p.(string)), &v); err != nil {
		return v, true, fmt.Errorf("decode fields of %s: %w", objectKey, err)
	}
	return v, true, nil
}

// ChainNames returns the configured chain names, sorted.
func (e *Engine) ChainNames() []string {
	names := make([]string, 0, len(e.chains))
	for n := range e.chains {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// IndexNames returns the configured index names, sorted.
func (e *Engine) IndexNames() []string {
	names := make([]string, 0, len(e.byIndex))
	for n := range e.byIndex {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
