package sync

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/iidp/metasync/indexer"
)

// Subscription delivers the answers of a Target as they change; see
// Engine.Subscribe. Calls of Next are serialized (one waits for the
// other); Close, HasSynced and Version may be called from any goroutine.
type Subscription struct {
	e      *Engine
	target Target
	// What the target reads, in the engine's view: the index (key and
	// index subscriptions) or the chain's indexes. Written under the
	// hub's lock, by Subscribe and then by Next only.
	ix      indexer.Index
	steps   []indexer.Index
	stop    func() bool // unregisters the context's AfterFunc
	done    chan struct{}
	once    gosync.Once
	synced  atomic.Bool
	version atomic.Pointer[string] // see Version

	// A subscription's state has three owners, each with its lock:
	inbox          // what the hub hands to Next, under inbox.mu
	outbox         // what Next has sent and is sending, under nextMu
	path   subPath // where the hub holds a key or chain subscription, under hub.mu
}

// inbox is what the hub tells a subscription between two calls of Next:
// written by the hub (under hub.mu, then mu), read and reset by Next.
type inbox struct {
	mu     gosync.Mutex
	signal chan struct{} // capacity 1: something is pending
	gone   bool          // a reload removed the target
	rebind bool          // a reload changed what the target reads

	// Key and chain subscriptions.
	dirty bool // the answer may have changed

	// Index subscriptions.
	pending  map[string]struct{}
	overflow bool              // pending was given up (see markKeys)
	pendAt   *indexer.Snapshot // the snapshot of the last hook that added to pending
	// base and baseIx: what the subscriber holds once the queue is
	// delivered is the values of baseIx in base. nil when the subscriber
	// holds the current values of its index, none changed since (it is
	// caught up): the hub then sets base at the next change, to the
	// snapshot that the change replaced. An idle subscription so holds no
	// snapshot, nor any copy of the index: what it sent is read back from
	// the immutable snapshots the store shares.
	base   *indexer.Snapshot
	baseIx indexer.Index
}

// outbox is Next's own state, under nextMu (calls of Next are serialized
// by it).
type outbox struct {
	nextMu  gosync.Mutex
	phase   int
	resumed bool

	// Key and chain subscriptions.
	force bool     // send the next answer even if equal to last
	last  []string // the last answer sent

	// Index subscriptions: the keys to send, sorted, each with its values
	// in batchIx of batch. For an initial snapshot, the batch's own sorted
	// keys (Snapshot.Keys, shared by every reader): nothing is copied.
	queue    []string
	batch    *indexer.Snapshot
	batchIx  indexer.Index
	complete uint64 // every change up to this seq is delivered
}

// subPath is what the hub holds of a key or chain subscription: the keys
// it is registered on, per index (under hub.mu).
type subPath = map[indexer.Index]map[string]struct{}

// pendingMax is the most keys an index subscription keeps pending (and
// the most a commit may change for them to be kept): past it, it
// compares the whole index when Next comes instead. A fixed bound, not
// one of the index's size: the hub marks the subscriptions under its
// lock, which every commit's hook takes.
const pendingMax = 4096

const (
	phaseWait = iota // for the resources to sync
	phaseStart
	phaseInitial // index: delivering the snapshot or catch-up queue
	phaseLive
)

// Subscribe follows a target: the subscriber first gets the current answer
// (for an index, each key that has values, then EventSynced), then each
// change of the answer, from Next. The initial answer waits until the
// resources behind the target have synced, so that it is the cluster's,
// not "not known yet".
//
// Guarantees:
//   - Latest state, coalesced. A slow subscriber never blocks writers or
//     other subscribers and never holds a backlog: the changes of a key
//     that it has not taken yet collapse into the newest answer. It never
//     gets an older answer after a newer one, nor an update equal to the
//     previous answer of that key.
//   - Only the affected. A write costs in proportion to the subscribers of
//     the keys it changes (and of the whole index), not to all subscribers.
//   - Chains follow every step: a chain subscriber is told when the key
//     moves to other values at any step, or the values of a later step
//     change.
//   - A relist after a broken watch changes only what differs, deletes
//     included, and subscribers hear only of that.
//
// The subscription ends when ctx ends or Close is called; it holds no
// goroutine. An unknown index or chain is an error.
func (e *Engine) Subscribe(ctx context.Context, t Target) (*Subscription, error) {
	s := &Subscription{e: e, target: t, done: make(chan struct{}), inbox: inbox{signal: make(chan struct{}, 1)}}
	if err := e.hub.add(s); err != nil {
		return nil, err
	}
	// ctx may have ended already: Close then runs at once, in another
	// goroutine, and must find s.stop set.
	ready := make(chan struct{})
	s.stop = context.AfterFunc(ctx, func() { <-ready; s.Close() })
	close(ready)
	return s, nil
}

// Close ends the subscription: Next returns ErrClosed. It is idempotent.
func (s *Subscription) Close() {
	s.once.Do(func() {
		s.stop()
		// done first: a registration that Next makes from now on sees it
		// (under the hub's lock) and stays out; one made before is undone.
		close(s.done)
		s.e.hub.unregister(s)
		s.e.hub.opened.Add(-1)
	})
}

// HasSynced reports whether the subscriber has received the initial state
// (or, for a resume, what changed since): as client-go's
// ResourceEventHandlerRegistration.HasSynced, for this subscriber.
func (s *Subscription) HasSynced() bool { return s.synced.Load() }

// Version is the Version of the state delivered so far, for a heartbeat;
// "" before the initial state.
func (s *Subscription) Version() string {
	if v := s.version.Load(); v != nil {
		return *v
	}
	return ""
}

// versionOf is the version of what a subscriber holds at seq: for a key or
// chain, with the answer's hash; for an index, with the index's tag.
func (s *Subscription) versionOf(seq uint64, values []string) string {
	if s.target.All {
		return s.e.version(seq) + ":" + indexTag(s.target.Index)
	}
	return s.e.version(seq) + ":" + answerHash(values)
}

// settle records the version of the state delivered so far.
func (s *Subscription) settle(v string) {
	s.version.Store(&v)
}

// Next returns the next event, waiting for one until ctx ends (its error
// is returned) or the subscription is closed (ErrClosed).
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	s.nextMu.Lock()
	defer s.nextMu.Unlock()
	for {
		select {
		case <-s.done:
			return Event{}, ErrClosed
		default:
		}
		if gone, rebind := s.takeReload(); gone {
			s.Close()
			return Event{Type: EventGone, Key: s.target.Key}, nil
		} else if rebind && !s.e.hub.rebind(s, s.phase != phaseWait && s.phase != phaseStart) {
			s.Close()
			return Event{Type: EventGone, Key: s.target.Key}, nil
		}
		// Until the indexes behind the target have synced, an empty answer
		// means "not known yet": the first answer waits, and so do the
		// updates of a subscription that a reload moved to an index that
		// has not listed yet.
		if w := s.unsynced(); w != nil {
			select {
			case <-w.Synced:
				continue
			case <-s.signal:
				continue // a reload, or a change: look again
			case <-s.done:
				return Event{}, ErrClosed
			case <-ctx.Done():
				return Event{}, ctx.Err()
			}
		}
		if s.phase == phaseWait {
			s.phase = phaseStart
		}
		if ev, ok := s.step(); ok {
			return ev, nil
		}
		select {
		case <-s.signal:
		case <-s.done:
			return Event{}, ErrClosed
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// unsynced returns a watcher behind the target that has not synced, or nil
// (nil too when a reload removed the target: Next then learns it is gone).
func (s *Subscription) unsynced() *follow.Watcher {
	v, _ := s.e.view()
	names := []string{s.target.Index}
	if s.target.Chain != "" {
		names = v.chains[s.target.Chain].indexes
	}
	for _, n := range names {
		if r := v.byIndex[n]; r != nil && !r.indexSynced(n) {
			return r.unsynced(n)
		}
	}
	return nil
}

// takeReload reports and clears what a reload told the subscription.
func (s *Subscription) takeReload() (gone, rebind bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gone, rebind = s.gone, s.rebind
	s.rebind = false
	return gone, rebind
}

// step makes the next event, if there is one now.
func (s *Subscription) step() (Event, bool) {
	switch {
	case s.target.All:
		return s.stepIndex()
	case s.steps != nil:
		return s.stepChain()
	default:
		return s.stepKey()
	}
}

// takeDirty reports and clears the dirty mark.
func (s *Subscription) takeDirty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dirty
	s.dirty = false
	return d
}

// answer makes a key or chain event of values read from snap, or nothing
// when they equal the last answer sent.
func (s *Subscription) answer(t EventType, snap *indexer.Snapshot, values []string) (Event, bool) {
	if t == EventUpdate && !s.force && slices.Equal(values, s.last) {
		return Event{}, false
	}
	s.last, s.force = values, false
	s.complete = snap.Seq()
	v := s.versionOf(s.complete, values)
	s.settle(v)
	s.synced.Store(true)
	return Event{Type: t, Key: s.target.Key, Values: values, Version: v}, true
}

// start decides how a key or chain subscription begins: a reset, a
// snapshot, or (a resume) an update only if the answer changed.
func (s *Subscription) start(snap *indexer.Snapshot, values []string) (Event, bool) {
	if s.target.Resume != "" && !s.resumed {
		s.resumed = true
		seq, hash, ok := s.e.parseVersion(s.target.Resume)
		if !ok || hash == "" || strings.HasPrefix(hash, "~") || seq > snap.Seq() {
			s.e.hub.resets.Add(1)
			return Event{Type: EventReset, Version: s.e.version(snap.Seq())}, true
		}
		s.phase = phaseLive
		if hash == answerHash(values) {
			s.last = values
			s.complete = snap.Seq()
			s.settle(s.versionOf(s.complete, values))
			s.synced.Store(true)
			return Event{}, false
		}
		// The subscriber holds another answer, whatever it was: send this
		// one even when it is empty.
		s.force = true
		return s.answer(EventUpdate, snap, values)
	}
	s.phase = phaseLive
	return s.answer(EventSnapshot, snap, values)
}

func (s *Subscription) stepKey() (Event, bool) {
	if s.target.Cluster != "" {
		return s.stepPart()
	}
	if s.phase == phaseStart {
		s.e.hub.registerKey(s, s.ix, s.target.Key)
		snap := s.e.store.Snapshot()
		if !s.boundIn(snap) {
			return Event{}, false
		}
		return s.start(snap, snap.LookupPreferring(s.ix, s.target.Key, s.target.At.prefer()...))
	}
	if !s.takeDirty() {
		return Event{}, false
	}
	snap := s.e.store.Snapshot()
	if !s.boundIn(snap) {
		return Event{}, false
	}
	return s.answer(EventUpdate, snap, snap.LookupPreferring(s.ix, s.target.Key, s.target.At.prefer()...))
}

// boundIn reports whether the subscription reads, in snap's config, what
// it is bound to. When not, a reload was published that the hub has not
// told the subscription of yet (or a reload is newer than snap): it reads
// nothing from snap, which may hold a removed index emptied, and binds
// again (or learns that its target is gone) at the next turn of Next.
func (s *Subscription) boundIn(snap *indexer.Snapshot) bool {
	ix, steps, err := bindingOf(snap.Meta().(*view), snap, s.target)
	if err == nil && ix == s.ix && slices.Equal(steps, s.steps) {
		return true
	}
	s.mu.Lock()
	s.rebind = true
	s.mu.Unlock()
	s.wake()
	return false
}

// stepPart is stepKey and stepChain for a target narrowed to a
// cluster: it registers on every index and key that its part reads.
func (s *Subscription) stepPart() (Event, bool) {
	if s.phase != phaseStart && !s.takeDirty() {
		return Event{}, false
	}
	snap := s.e.store.Snapshot()
	if !s.boundIn(snap) {
		return Event{}, false
	}
	values, path := snap.Meta().(*view).partOf(snap, s.target)
	s.e.hub.registerPath(s, path)
	if s.e.store.Snapshot().Seq() != snap.Seq() {
		s.mark() // a write between the read and the registration
	}
	if s.phase == phaseStart {
		return s.start(snap, values)
	}
	return s.answer(EventUpdate, snap, values)
}

func (s *Subscription) stepChain() (Event, bool) {
	if s.target.Cluster != "" {
		return s.stepPart()
	}
	if s.phase != phaseStart && !s.takeDirty() {
		return Event{}, false
	}
	snap := s.e.store.Snapshot()
	if !s.boundIn(snap) {
		return Event{}, false
	}
	values := s.resolve(snap)
	if s.phase == phaseStart {
		return s.start(snap, values)
	}
	return s.answer(EventUpdate, snap, values)
}

// resolve follows the chain on snap and registers the subscription on
// every key of the path, so that a change at any step marks it dirty.
func (s *Subscription) resolve(snap *indexer.Snapshot) []string {
	path := make(map[indexer.Index]map[string]struct{}, len(s.steps))
	keys := []string{s.target.Key}
	prefer := s.target.At.prefer()
	for _, ix := range s.steps {
		set := make(map[string]struct{}, len(keys))
		var next []string
		for _, k := range keys {
			set[k] = struct{}{}
			next = append(next, snap.LookupPreferring(ix, k, prefer...)...)
		}
		path[ix] = set
		slices.Sort(next)
		keys = slices.Compact(next)
	}
	s.e.hub.registerPath(s, path)
	// A write published after snap whose hook ran before the path was
	// registered would go unnoticed: look again.
	if s.e.store.Snapshot().Seq() != snap.Seq() {
		s.mark()
	}
	if len(keys) == 0 {
		return nil
	}
	return slices.Clip(keys)
}

// mark sets the dirty mark and wakes Next.
func (s *Subscription) mark() {
	s.mu.Lock()
	if s.dirty {
		s.e.hub.coalesced.Add(1)
	}
	s.dirty = true
	s.mu.Unlock()
	s.wake()
}

// wake makes a waiting Next look again.
func (s *Subscription) wake() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// markKeys adds keys of the index ix that a commit changed, from prev to
// next, and wakes Next. A subscriber that was caught up held the values of
// prev: that becomes its base.
func (s *Subscription) markKeys(keys []string, ix indexer.Index, prev, next *indexer.Snapshot) {
	s.mu.Lock()
	n := 0
	if s.base == nil {
		s.base, s.baseIx = prev, ix
	}
	if !s.overflow && len(keys) > pendingMax {
		// A large commit (a relist): the subscriber compares the whole
		// index when Next comes, outside every lock, and the hub, which
		// marks every subscription of the index under its lock, pays
		// nothing per key.
		s.pending, s.overflow = nil, true
	}
	if !s.overflow {
		if s.pending == nil {
			s.pending = make(map[string]struct{}, len(keys))
		}
		for _, k := range keys {
			if _, ok := s.pending[k]; ok {
				n++
			}
			s.pending[k] = struct{}{}
		}
		// Keys that come and go would grow the pending set past the
		// index: past pendingMax, give the set up and compare the whole
		// index with what was sent instead, when Next comes.
		if len(s.pending) > pendingMax {
			s.pending, s.overflow = nil, true
		}
	} else {
		n = len(keys)
	}
	s.pendAt = next
	s.mu.Unlock()
	if n > 0 {
		s.e.hub.coalesced.Add(int64(n))
	}
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// markWhole makes an index subscription compare its whole index (ix) at
// next with what it holds, the values of prev when it was caught up, and
// wakes Next.
func (s *Subscription) markWhole(ix indexer.Index, prev, next *indexer.Snapshot) {
	s.mu.Lock()
	if s.base == nil {
		s.base, s.baseIx = prev, ix
	}
	s.pending, s.overflow, s.pendAt = nil, true, next
	s.mu.Unlock()
	s.wake()
}

// caughtUp is called when a batch is delivered: the subscriber holds the
// values of its batch's snapshot. With nothing marked since, those are the
// current values of its index, and it lets go of every snapshot (the hub
// gives it a base again at the next change); else the batch is its base.
func (s *Subscription) caughtUp() {
	s.mu.Lock()
	if len(s.pending) == 0 && !s.overflow {
		s.base = nil
	}
	s.mu.Unlock()
	s.batch = nil
}

// indexTag names an index in its subscriptions' versions, so that the
// version of one index cannot resume another's.
func indexTag(index string) string { return "~" + answerHash([]string{index}) }

// answerSeed is the secret of answerHash, drawn per process: a version
// names the engine's run (its epoch), so no version outlives the process
// whose seed digested it.
var answerSeed = newAnswerSeed()

func newAnswerSeed() maphash.Seed { return maphash.MakeSeed() }

// answerHash is a short digest of an answer, for resuming a key or chain
// subscription without a journal: a resume whose digest equals the
// current answer's sends nothing. Values are chosen by whoever writes the
// objects, so the digest is seeded (no answer can be crafted to digest as
// another) and each value is preceded by its length (["a\x00b"] and
// ["a", "b"] are two answers).
func answerHash(values []string) string {
	var h maphash.Hash
	h.SetSeed(answerSeed)
	var n [binary.MaxVarintLen64]byte
	for _, v := range values {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(v)))])
		h.WriteString(v)
	}
	return strconv.FormatUint(h.Sum64(), 36)
}
