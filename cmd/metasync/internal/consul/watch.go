package consul

import (
	"container/list"
	"context"
	"slices"
	gosync "sync"
	"sync/atomic"
	"time"

	msync "github.com/iidp/metasync/sync"
)

// watches follow the engine for the blocking queries: one watch per
// service name (or the catalog's list of services) that some query waits
// on, shared by every query of it, with one engine subscription per
// source. A name's watch subscribes to that key alone, whether or not it
// is a service now: a write wakes it only when it changes that key's
// answer (a name that is no service, when it becomes one), so that what
// a name's queries cost is its own key's changes, never the index's. Only
// the catalog's watch follows every key.
// A watch whose last query has answered stays a while (idleTTL, at most
// maxIdle of them, maxIdlePerCaller left by one caller), so that a
// client's next query, sent as soon as it has its answer, finds it and
// waits rather than answering at once.
type watches struct {
	s *Server

	mu     gosync.Mutex
	all    map[watchKey]*watch
	idle   *list.List     // of *watch with no query, the longest idle first
	idleBy map[string]int // idle watches by the caller of their last query
	count  atomic.Int64
}

// watchKey names what a watch follows: one service, or the list of
// services (catalog).
type watchKey struct {
	catalog bool
	service string
}

// watch is one service (or the catalog) that blocking queries wait on.
type watch struct {
	ws      *watches
	key     watchKey
	waiters int           // under watches.mu
	idle    *list.Element // under watches.mu: in watches.idle while no query waits
	since   time.Time     // under watches.mu: idle since
	owner   string        // under watches.mu: the caller of its last query, while idle
	cancel  context.CancelFunc

	refresh gosync.Mutex // one read at a time
	st      atomic.Pointer[state]
	// floor is the highest index answered from the watch (written under
	// refresh): a query that waited in vain answers the index it sent
	// when that is above the state's, and every later state passes it.
	floor atomic.Uint64
}

// state is one answer of a watch (or of a read without one); it never
// changes once published.
type state struct {
	// index is the answer's X-Consul-Index: it passes the index of every
	// earlier state of the same watch.
	index  uint64
	synced bool // every source behind it has synced
	// stales tells, per source, whether its answer is stale
	// (X-Consul-KnownLeader false).
	stales []bool
	// parts holds each source's instances (a service), or names each
	// source's keys (the catalog), in the order of Server.sources.
	parts [][]instance
	names [][]string
	// changed is closed when a newer state replaces this one.
	changed chan struct{}
}

// staleFor reports whether st's answer, of the sources the caller may
// read (may), is stale.
func (st *state) staleFor(may []bool) bool {
	for i, stale := range st.stales {
		if stale && may[i] {
			return true
		}
	}
	return false
}

// idleTTL is how long a watch with no query stays; maxIdle bounds such
// watches: beyond, the one idle longest stops; maxIdlePerCaller bounds
// those that one caller's queries left: beyond, that caller's idle
// longest stops.
const (
	idleTTL          = time.Minute
	maxIdle          = 1024
	maxIdlePerCaller = 256
)

func newWatches(s *Server) *watches {
	return &watches{s: s, all: map[watchKey]*watch{}, idle: list.New(), idleBy: map[string]int{}}
}

// acquire returns the watch of k with one more query on it, starting it
// when there is none.
func (ws *watches) acquire(k watchKey) *watch {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.sweep(time.Now())
	w := ws.all[k]
	if w == nil {
		w = &watch{ws: ws, key: k}
		w.st.Store(ws.s.read(k, nil))
		ctx, cancel := context.WithCancel(context.Background())
		w.cancel = cancel
		ws.all[k] = w
		ws.count.Add(1)
		for _, src := range ws.s.sources {
			go w.follow(ctx, src)
		}
	}
	if w.idle != nil {
		ws.unidle(w)
	}
	w.waiters++
	return w
}

// release takes caller's query off w: the last one leaves it idle, the
// caller's.
func (ws *watches) release(w *watch, caller string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w.waiters--
	if w.waiters > 0 || ws.all[w.key] != w {
		return
	}
	w.since, w.owner = time.Now(), caller
	w.idle = ws.idle.PushBack(w)
	if ws.idleBy[caller]++; ws.idleBy[caller] > maxIdlePerCaller {
		for e := ws.idle.Front(); e != nil; e = e.Next() {
			if v := e.Value.(*watch); v.owner == caller {
				ws.stop(v)
				ws.s.metrics.refused.WithLabelValues(refusedServices).Inc()
				break
			}
		}
	}
	for ws.idle.Len() > maxIdle {
		ws.stop(ws.idle.Front().Value.(*watch))
	}
}

// unidle takes w off the idle list (under mu).
func (ws *watches) unidle(w *watch) {
	ws.idle.Remove(w.idle)
	w.idle = nil
	if ws.idleBy[w.owner]--; ws.idleBy[w.owner] <= 0 {
		delete(ws.idleBy, w.owner)
	}
	w.owner = ""
}

// highest is the highest index that k's watch has given, 0 without one.
func (ws *watches) highest(k watchKey) uint64 {
	ws.mu.Lock()
	w := ws.all[k]
	ws.mu.Unlock()
	if w == nil {
		return 0
	}
	return max(w.current().index, w.floor.Load())
}

// sweep stops the watches idle for idleTTL (under mu).
func (ws *watches) sweep(now time.Time) {
	for e := ws.idle.Front(); e != nil; e = ws.idle.Front() {
		w := e.Value.(*watch)
		if now.Sub(w.since) < idleTTL {
			return
		}
		ws.stop(w)
	}
}

// stop ends an idle watch (under mu).
func (ws *watches) stop(w *watch) {
	ws.unidle(w)
	delete(ws.all, w.key)
	ws.count.Add(-1)
	w.cancel()
}

// stopAll ends the subscriptions of every watch (the drain).
func (ws *watches) stopAll() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for k, w := range ws.all {
		if w.idle != nil {
			ws.unidle(w)
		}
		delete(ws.all, k)
		ws.count.Add(-1)
		w.cancel()
	}
}

// runSweeper stops idle watches every idleTTL/4 until ctx ends, so that
// a daemon whose queries stopped lets their subscriptions go.
func (ws *watches) runSweeper(ctx context.Context) {
	t := time.NewTicker(idleTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			ws.mu.Lock()
			ws.sweep(now)
			ws.mu.Unlock()
		}
	}
}

// current is what the watch answers now.
func (w *watch) current() *state { return w.st.Load() }

// answered is what a query that sent index answers, when its wait is
// over: the current state, and the higher of its index and the query's
// (an index this daemon could have given), so that no client sees its
// index go backwards; every later state of w passes it.
func (w *watch) answered(index uint64) (*state, uint64) {
	w.refresh.Lock()
	defer w.refresh.Unlock()
	st := w.st.Load()
	idx := max(st.index, index)
	if idx > w.floor.Load() {
		w.floor.Store(idx)
	}
	return st, idx
}

// follow subscribes to what src gives w and reads w again at each event,
// until ctx ends; the catalog's, whose subscription starts with one
// snapshot event per key of the index, reads once at their end
// (EventSynced), not at each. A source that is unknown or that a reload
// removes is subscribed again after the next reload.
func (w *watch) follow(ctx context.Context, src Source) {
	e := w.ws.s.engine
	for ctx.Err() == nil {
		reloaded := e.StaleChanged()
		if t, ok := w.ws.s.subscription(w.key, src); ok {
			if sub, err := e.Subscribe(ctx, t); err == nil {
				for {
					ev, err := sub.Next(ctx)
					if err != nil || ev.Type == msync.EventGone {
						break
					}
					if ev.Type == msync.EventSnapshot && t.All {
						continue
					}
					w.update()
				}
				sub.Close()
			}
		}
		w.update() // what a removed source gave is gone
		select {
		case <-ctx.Done():
			return
		case <-reloaded:
		}
	}
}

// update reads w again and publishes the new state when the answer
// changed.
func (w *watch) update() {
	w.refresh.Lock()
	defer w.refresh.Unlock()
	old := w.st.Load()
	if next := w.ws.s.read(w.key, old); next != old {
		if f := w.floor.Load(); next.index <= f {
			next.index = f + 1
			w.ws.s.seen(next.index)
		}
		w.st.Store(next)
		close(old.changed)
	}
}

// subscription is the engine target that tells a watch of k that src's
// part may have changed: the service's key (an index key, or a chain's,
// which follows each step), present or not, or for the catalog every key
// of the index whose keys are the source's (a chain's first index).
func (s *Server) subscription(k watchKey, src Source) (msync.Target, bool) {
	if !k.catalog {
		if !s.exists(src) {
			return msync.Target{}, false
		}
		return src.target(k.service), true
	}
	index, ok := s.keysIndex(src)
	return msync.IndexOf(index), ok
}

// exists reports whether the engine has src's chain or index.
func (s *Server) exists(src Source) bool {
	if src.Kind == "chains" {
		return s.engine.HasChain(src.Name)
	}
	return s.engine.HasIndex(src.Name)
}

// keysIndex is the index whose keys are src's services: the index
// itself, or a chain's first index.
func (s *Server) keysIndex(src Source) (string, bool) {
	if src.Kind == "indexes" {
		return src.Name, s.engine.HasIndex(src.Name)
	}
	for _, c := range s.engine.Chains() {
		if c.Name == src.Name && len(c.Indexes) > 0 {
			return c.Indexes[0], true
		}
	}
	return "", false
}

// read reads k from one state of the engine. It returns prev when the
// answer is prev's; else a new state, whose index passes prev's.
func (s *Server) read(k watchKey, prev *state) *state {
	var ts []msync.Target
	var of []int // the source of each target
	for i, src := range s.sources {
		var t msync.Target
		if k.catalog {
			index, ok := s.keysIndex(src)
			if !ok {
				continue
			}
			t = msync.IndexOf(index)
		} else {
			if !s.exists(src) {
				continue
			}
			t = src.target(k.service)
		}
		ts = append(ts, t)
		of = append(of, i)
	}
	// Target{} reads nothing: it gives the state's Seq when no source
	// exists.
	as := s.engine.Answers(append(ts, msync.Target{})...)
	next := &state{synced: true, changed: make(chan struct{}), stales: make([]bool, len(s.sources))}
	if k.catalog {
		next.names = make([][]string, len(s.sources))
	} else {
		next.parts = make([][]instance, len(s.sources))
	}
	for j, a := range as[:len(ts)] {
		next.synced = next.synced && a.Synced
		next.stales[of[j]] = a.Stale
		if k.catalog {
			next.names[of[j]] = a.Values
		} else {
			next.parts[of[j]] = instances(a.Values, s.sources[of[j]].String())
		}
	}
	next.index = s.base + as[len(ts)].Seq
	if prev != nil {
		if prev.synced == next.synced && slices.Equal(prev.stales, next.stales) && slices.EqualFunc(prev.parts, next.parts, slices.Equal[[]instance]) &&
			slices.EqualFunc(prev.names, next.names, slices.Equal[[]string]) {
			return prev
		}
		next.index = max(next.index, prev.index+1)
	}
	s.seen(next.index)
	return next
}
