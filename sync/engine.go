package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	compiled "github.com/iidp/metasync/internal/plan"

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

// errEmptyPlan is the error of a zero schema.Plan, which only Compile and
// LoadPlan can fill.
var errEmptyPlan = errors.New("an empty schema.Plan: build one with schema.Compile or schema.LoadPlan")

// DefaultStaleAfter is the default of Options.StaleAfter.
const DefaultStaleAfter = 30 * time.Second

// Engine keeps the indexes of a Plan in sync with a cluster.
type Engine struct {
	plan     *compiled.Plan
	log      *slog.Logger
	store    *indexer.Store
	watchers []*watcher
	byName   map[string]*watcher // resource name
	byIndex  map[string]*watcher // index name
	chains   map[string][]indexer.Index
	started  atomic.Bool
	hub      *hub   // routes commits to subscriptions
	epoch    string // names this engine's run in subscription versions

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
	cp := compiled.Of(plan)
	if cp == nil {
		return nil, errEmptyPlan
	}
	e, err := newEngine(cp, opts)
	if err != nil {
		return nil, err
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
	for _, w := range e.watchers {
		r := w.plan
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
	}
	return e, nil
}

// newEngine builds an Engine of a compiled plan without a cluster: its
// watchers have no client until New gives them one.
func newEngine(plan *compiled.Plan, opts Options) (*Engine, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	var specs []indexer.SourceSpec
	for _, r := range plan.Resources {
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
	e.hub, e.epoch = newHub(store), newEpoch()
	for _, r := range plan.Resources {
		w := newWatcher(r, nil, store, log)
		e.watchers = append(e.watchers, w)
		e.byName[r.Name] = w
		for _, ix := range r.Indexes {
			e.byIndex[ix.Name] = w
		}
	}
	for _, ch := range plan.Chains {
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
