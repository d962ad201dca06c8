package xds

import (
	"bytes"
	"context"
	"net"
	"strconv"
	gosync "sync"
	"sync/atomic"

	msync "github.com/iidp/metasync/sync"
)

// cache follows the engine for the assignments that clients follow: one
// entry per (assignment, zone), whatever the number of its followers.
// An entry holds one engine subscription per part it reads (the whole
// answer, the zone's, and of a config with a home cluster the home's),
// and the assignment encoded once, from
// one state of the engine (Inspector.Answers), published for its followers
// to read. A change of the answer re-encodes that entry alone and wakes
// its followers alone. An entry lives while some client follows it.
type cache struct {
	engine Engine
	encode func(name string, p parts) []byte

	mu      gosync.Mutex
	entries map[entryKey]*entry
	// started counts the entries living, by the caller whose client
	// started each (see Limits.Assignments).
	started map[string]int
	// reloaded is the engine's StaleChanged channel whose close the
	// cache last handled: the streams that see it closed all ask to
	// restart ended entries, the first one does.
	reloaded <-chan struct{}
}

// entryKey is what an entry serves: an assignment for clients of a zone
// ("" for none).
type entryKey struct {
	name, zone string
}

// entry is one assignment that clients follow.
type entry struct {
	c   *cache
	key entryKey
	t   target

	// Under cache.mu: who follows it; its subscriptions' end (cancel),
	// and whether they ended by themselves (an unknown or removed
	// target: started again after a reload).
	followers map[*client]struct{}
	cancel    context.CancelFunc
	ended     bool
	starter   string // the caller whose client started it
	// home is the home cluster whose part the entry's latest start
	// follows (its runs hold their own copy); "" for none. Under
	// cache.mu.
	home string

	refresh gosync.Mutex // one update or end at a time
	state   atomic.Pointer[assignment]
}

// assignment is one published state of an entry; it never changes once
// published, and clients compare states by pointer.
type assignment struct {
	// resource is the ClusterLoadAssignment; nil while the target is gone.
	resource []byte
}

func newCache(engine Engine, encode func(name string, p parts) []byte) *cache {
	return &cache{engine: engine, encode: encode, entries: map[entryKey]*entry{}}
}

// follow makes c a follower of the assignment name of target t for its
// zone, starting the entry when it is the first; nil when that would
// pass limit entries, or a quarter of them started by c's caller.
func (ca *cache) follow(c *client, name string, t target, zone string, limit int) *entry {
	k := entryKey{name, zone}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	e := ca.entries[k]
	if e == nil {
		if limit > 0 && (len(ca.entries) >= limit || ca.started[c.caller] >= max(1, limit/4)) {
			return nil
		}
		e = &entry{c: ca, key: k, t: t, followers: map[*client]struct{}{}, starter: c.caller}
		ca.entries[k] = e
		if ca.started == nil {
			ca.started = map[string]int{}
		}
		ca.started[c.caller]++
		e.start()
	}
	e.followers[c] = struct{}{}
	return e
}

// unfollow ends c's following of e; the last follower's leaving stops
// the entry.
func (ca *cache) unfollow(c *client, e *entry) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	delete(e.followers, c)
	if len(e.followers) == 0 && ca.entries[e.key] == e {
		delete(ca.entries, e.key)
		if ca.started[e.starter]--; ca.started[e.starter] <= 0 {
			delete(ca.started, e.starter)
		}
		e.cancel()
	}
}

// restartEnded starts again the entries whose subscriptions ended (their
// target was unknown, or a reload removed it), and those that follow
// another home cluster than the engine's now (a reload changed it), once
// per close of the engine's StaleChanged channel ch. An entry restarted
// keeps its assignment published until its new runs publish theirs.
func (ca *cache) restartEnded(ch <-chan struct{}) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if ca.reloaded == ch {
		return
	}
	ca.reloaded = ch
	home := ca.engine.HomeCluster()
	for _, e := range ca.entries {
		if e.ended || e.home != home {
			e.cancel()
			e.start()
		}
	}
}

// size is the number of entries and of their engine subscriptions.
func (ca *cache) size() (entries, subscriptions int) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	for k := range ca.entries {
		entries++
		subscriptions++
		if k.zone != "" {
			subscriptions++
		}
		if ca.entries[k].home != "" {
			subscriptions++
		}
	}
	return entries, subscriptions
}

// start subscribes e to the engine (under cache.mu): the whole answer,
// with a zone the zone's answer too (its hints may change alone), and
// with a home cluster the home's part (it may change while the whole
// answer stays: a value that another cluster gives too).
func (e *entry) start() {
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.ended = cancel, false
	e.home = e.c.engine.HomeCluster()
	answered := new(atomic.Bool) // the whole answer came once, in this run
	home := e.home
	go e.run(ctx, answered, e.t.msync(), home)
	if e.key.zone != "" {
		go e.run(ctx, answered, e.local(), home)
	}
	if home != "" {
		go e.run(ctx, answered, e.homePart(home), home)
	}
}

// local is e's target narrowed to its zone.
func (e *entry) local() msync.Target {
	t := e.t.msync()
	t.At = msync.Locality{Zone: e.key.zone}
	return t
}

// homePart is e's target narrowed to the home cluster's part.
func (e *entry) homePart(home string) msync.Target {
	t := e.t.msync()
	t.Cluster = home
	return t
}

// run follows one part t of e's target until ctx ends, or the target
// is gone or unknown. Each change reads every part again (update), of
// home's part too when home is not "".
func (e *entry) run(ctx context.Context, answered *atomic.Bool, t msync.Target, home string) {
	whole := t.At == (msync.Locality{}) && t.Cluster == ""
	// The home's part ends when a reload removes the home cluster; the
	// entry goes on with the other runs until restartEnded starts it
	// again without it: its assignment is not emptied meanwhile.
	homePart := t.Cluster != ""
	sub, err := e.c.engine.Subscribe(ctx, t)
	if err != nil {
		if !homePart {
			e.end(ctx) // an unknown target: it has no Listener either
		}
		return
	}
	defer sub.Close()
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			return
		}
		switch ev.Type {
		case msync.EventSnapshot, msync.EventUpdate:
			if whole {
				answered.Store(true)
			}
			if answered.Load() {
				e.update(ctx, home)
			}
		case msync.EventGone:
			if !homePart {
				e.end(ctx)
			}
			return
		}
	}
}

// end marks e ended and publishes it gone, which its followers drop;
// nothing when ctx was cancelled first (by unfollow or a restart, whose
// run publishes).
func (e *entry) end(ctx context.Context) {
	e.refresh.Lock()
	defer e.refresh.Unlock()
	e.c.mu.Lock()
	if ctx.Err() != nil {
		e.c.mu.Unlock()
		return
	}
	e.ended = true
	e.c.mu.Unlock()
	if e.state.Load() != nil {
		e.publish(&assignment{})
	}
}

// update reads the answer of every locality of e from one state of the
// engine, encodes the assignment, and publishes it when it changed.
func (e *entry) update(ctx context.Context, home string) {
	e.refresh.Lock()
	defer e.refresh.Unlock()
	if ctx.Err() != nil {
		return
	}
	ts := []msync.Target{e.t.msync()}
	if e.key.zone != "" {
		ts = append(ts, e.local())
	}
	if home != "" {
		ts = append(ts, e.homePart(home))
	}
	as := e.c.engine.Answers(ts...)
	p := parts{values: as[0].Values, zone: e.key.zone}
	if e.key.zone != "" {
		p.local = as[1].Values
	}
	if home != "" {
		p.home, p.homeName = as[len(as)-1].Values, home
	}
	b := e.c.encode(e.key.name, p)
	if old := e.state.Load(); old != nil && old.resource != nil && bytes.Equal(old.resource, b) {
		return
	}
	e.publish(&assignment{resource: b})
}

// publish makes a the entry's state, and wakes its followers.
func (e *entry) publish(a *assignment) {
	e.state.Store(a)
	e.c.mu.Lock()
	defer e.c.mu.Unlock()
	for c := range e.followers {
		c.wake(e.key.name)
	}
}

// current is what the entry answers now: nil before the engine answered
// it, or while it is gone.
func (e *entry) current() *assignment {
	a := e.state.Load()
	if a == nil || a.resource == nil {
		return nil
	}
	return a
}

// parts is what an assignment is encoded from, read from one state of
// the engine (Inspector.Answers): the whole answer, its zone's narrowing
// (local, for a client of zone), and the home cluster's part (home, of
// a config with a home cluster).
type parts struct {
	values, local, home []string
	zone                string
	homeName            string // the home cluster's, with home
}

// encodeAnswer is the ClusterLoadAssignment of an answer: each host:port
// once (gRPC rejects a whole assignment with a duplicate address). A
// value that is not host:port is left out, and logged. The endpoints are
// split in up to four groups, in this order of priority: the home
// cluster's in the client's zone, the home cluster's others, the other
// clusters' in the zone, the other clusters' others. A split is made
// only when it parts the endpoints in two: without a home cluster (or
// when every endpoint is the home's, or none is) no cluster split,
// without a zone whose narrowed answer is a part of the answer (not all
// of it, nor nothing) no zone split. The groups with endpoints are
// localities of priorities 0, 1, ... in that order, so that gRPC fails
// over by itself: to the home's other zones when its zone has no ready
// endpoint, to the other clusters when the home has none. Without
// clusters or zone, one locality.
func (s *Server) encodeAnswer(name string, p parts) []byte {
	eps := s.endpoints(name, p.values)
	near := s.endpoints(name, p.local)
	home := s.endpoints(name, p.home)
	byZone := p.zone != "" && len(near) > 0 && len(near) < len(eps)
	byHome := len(home) > 0 && len(home) < len(eps)
	if !byZone && !byHome {
		return encodeAssignment(name, []locality{{eps: eps}})
	}
	isNear := map[endpoint]bool{}
	if byZone {
		for _, e := range near {
			isNear[e] = true
		}
	}
	isHome := map[endpoint]bool{}
	if byHome {
		for _, e := range home {
			isHome[e] = true
		}
	}
	// The group of each endpoint: 0 the home's near, 1 the home's
	// others, 2 the other clusters' near, 3 their others.
	var split [4][]endpoint
	for _, e := range eps {
		g := 0
		if byHome && !isHome[e] {
			g += 2
		}
		if byZone && !isNear[e] {
			g++
		}
		split[g] = append(split[g], e)
	}
	var groups []locality
	for g, es := range split {
		if len(es) == 0 {
			continue
		}
		l := locality{priority: uint32(len(groups)), eps: es}
		if g%2 == 0 && byZone {
			l.zone = p.zone
		}
		if g < 2 && byHome {
			l.subZone = p.homeName
		}
		groups = append(groups, l)
	}
	return encodeAssignment(name, groups)
}

// endpoints reads values as host:port, each once, in one spelling.
func (s *Server) endpoints(name string, values []string) []endpoint {
	var eps []endpoint
	seen := map[string]bool{}
	for _, v := range values {
		host, port, err := net.SplitHostPort(v)
		p, perr := strconv.ParseUint(port, 10, 16)
		if err != nil || perr != nil || host == "" || p == 0 {
			s.badLog.Do(func() {
				s.log.Warn("xDS: a value that is not host:port is left out of the assignment", "target", name, "value", v)
			})
			continue
		}
		if ip := net.ParseIP(host); ip != nil {
			host = ip.String() // one spelling of each address
		}
		addr := net.JoinHostPort(host, strconv.FormatUint(p, 10))
		if seen[addr] {
			continue
		}
		seen[addr] = true
		eps = append(eps, endpoint{host, uint32(p)})
	}
	return eps
}
