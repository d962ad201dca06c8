package sync

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/iidp/metasync/indexer"
)

func newHub(store *indexer.Store) *hub {
	h := &hub{latest: store.Snapshot(), indexes: map[indexer.Index]*indexSubs{}, subs: map[*Subscription]struct{}{}}
	store.OnCommit(h.commit)
	return h
}

func (h *hub) subsOf(ix indexer.Index) *indexSubs {
	is := h.indexes[ix]
	if is == nil {
		is = &indexSubs{keys: map[string]map[*Subscription]struct{}{}, all: map[*Subscription]struct{}{}}
		h.indexes[ix] = is
	}
	return is
}

// commit is the store's OnCommit hook: it marks the subscriptions of every
// changed key, and of every changed index, and journals the changes.
func (h *hub) commit(prev, next *indexer.Snapshot, changes []indexer.Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latest = next
	if prev.Meta() != next.Meta() {
		h.relayout(prev, next) // a reload
	}
	if len(changes) == 0 && next.Compacted() {
		// Compact: the same values in fresh memory. A snapshot from
		// before it would keep the old tables. (A Reconfigure's call
		// without changes is no Compact's: relayout, above, moves the
		// at of the indexes whose answers it changed.)
		for _, is := range h.indexes {
			// (Unless a reload came since at: it may have retired the
			// index, which next holds empty. Comparing the layouts costs
			// nothing; counting an index's keys would read its fallback.)
			if is.at != nil && next.Meta() == is.at.Meta() {
				is.at = next
			}
		}
	}
	for _, c := range changes {
		is := h.indexes[c.Index]
		if is == nil {
			continue
		}
		if j := is.journal; j != nil {
			if len(c.Keys) >= len(j.entries) {
				// The ring would keep only this commit's last keys,
				// and no resume from before it: forget, in O(1).
				j.reset(next.Seq())
			} else {
				for _, k := range c.Keys {
					j.add(journalEntry{seq: next.Seq(), key: k, prev: prev.Lookup(c.Index, k)})
				}
			}
		}
		if len(is.all) > 0 {
			is.at = next
		}
		for s := range is.all {
			s.markKeys(c.Keys, c.Index, prev, next)
		}
		if len(is.keys) == 0 {
			continue
		}
		if len(c.Keys) > is.nkeys {
			// A commit of more keys than there are registrations (a
			// relist): mark every key and chain subscription of the
			// index, which sends nothing when its answer is the same,
			// rather than look up each of the commit's keys under mu.
			for _, subs := range is.keys {
				for s := range subs {
					s.mark()
				}
			}
			continue
		}
		for _, k := range c.Keys {
			for s := range is.keys[k] {
				s.mark()
			}
		}
	}
}

// reset empties the journal: it remembers every change after seq (none
// yet), and nothing from before.
func (j *journal) reset(seq uint64) {
	clear(j.entries) // let go of the values
	j.next, j.full, j.floor = 0, false, seq
}

func (j *journal) add(e journalEntry) {
	if j.full {
		j.floor = max(j.floor, j.entries[j.next].seq)
	}
	j.entries[j.next] = e
	j.next++
	if j.next == len(j.entries) {
		j.next, j.full = 0, true
	}
}

// changedSince returns the keys whose value at seq differs from their
// value in snap, which the journal is complete up to; ok is false when the
// journal does not reach back to seq.
func (j *journal) changedSince(seq uint64, ix indexer.Index, snap *indexer.Snapshot) (keys []string, ok bool) {
	if seq < j.floor || seq > snap.Seq() {
		return nil, false
	}
	n := j.next
	start := 0
	if j.full {
		n, start = len(j.entries), j.next
	}
	first := map[string][]string{} // key -> its value at seq: before its first change after seq
	for i := range n {
		e := &j.entries[(start+i)%len(j.entries)]
		if e.seq <= seq {
			continue
		}
		if _, seen := first[e.key]; !seen {
			first[e.key] = e.prev
		}
	}
	for k, was := range first {
		if !slices.Equal(was, snap.Lookup(ix, k)) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys, true
}

func (h *hub) registerKey(s *Subscription, ix indexer.Index, key string) {
	h.registerPath(s, map[indexer.Index]map[string]struct{}{ix: {key: {}}})
}

// registerPath makes s's registered keys exactly path.
func (h *hub) registerPath(s *Subscription, path map[indexer.Index]map[string]struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-s.done:
		return // closed: stay out
	default:
	}
	for ix, keys := range s.path {
		for k := range keys {
			if _, keep := path[ix][k]; !keep {
				h.dropKey(s, ix, k)
			}
		}
	}
	for ix, keys := range path {
		is := h.subsOf(ix)
		for k := range keys {
			is.addKey(s, k)
		}
	}
	s.path = path
}

// addKey registers s on key; under mu.
func (is *indexSubs) addKey(s *Subscription, key string) {
	subs := is.keys[key]
	if subs == nil {
		subs = map[*Subscription]struct{}{}
		is.keys[key] = subs
	}
	if _, in := subs[s]; !in {
		subs[s] = struct{}{}
		is.nkeys++
	}
}

func (h *hub) dropKey(s *Subscription, ix indexer.Index, key string) {
	is := h.indexes[ix]
	if is == nil {
		return
	}
	if _, in := is.keys[key][s]; in {
		delete(is.keys[key], s)
		is.nkeys--
	}
	if len(is.keys[key]) == 0 {
		delete(is.keys, key)
	}
}

// registerIndex adds an index subscription and returns the snapshot its
// initial state is read from: the one of the last commit that the hub has
// seen, so that every later change reaches s. For a resume, it returns the
// keys that changed since the version resume, and ok when it can resume.
func (h *hub) registerIndex(s *Subscription, resume string) (snap *indexer.Snapshot, catchUp []string, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	snap = h.latest
	select {
	case <-s.done:
		return snap, nil, false
	default:
	}
	is := h.subsOf(s.ix)
	if is.journal == nil {
		is.journal = &journal{entries: make([]journalEntry, journalSize), floor: snap.Seq()}
	}
	is.all[s] = struct{}{}
	if is.at == nil {
		is.at = snap
	}
	// The initial state is snap's: what was marked before is in it, and
	// what the hub marks from now on is a change from it.
	s.mu.Lock()
	s.pending, s.overflow, s.pendAt = nil, false, nil
	s.base, s.baseIx = snap, s.ix
	s.mu.Unlock()
	if resume == "" {
		return snap, nil, false
	}
	seq, tag, valid := s.e.parseVersion(resume)
	if !valid || tag != indexTag(s.target.Index) {
		return snap, nil, false
	}
	catchUp, ok = is.journal.changedSince(seq, s.ix, snap)
	return snap, catchUp, ok
}

// add binds a new subscription to its target in the engine's current
// view and counts it among the open ones, under one lock with reconfigure:
// a reload either precedes the binding or sees the subscription.
func (h *hub) add(s *Subscription) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, snap := s.e.view()
	ix, steps, err := bindingOf(v, snap, s.target)
	if err != nil {
		return err
	}
	s.ix, s.steps = ix, steps
	h.subs[s] = struct{}{}
	h.opened.Add(1)
	return nil
}

// bindingOf finds what a target reads in one view: the index, or the
// chain's steps.
func bindingOf(v *view, snap *indexer.Snapshot, t Target) (indexer.Index, []indexer.Index, error) {
	switch {
	case t.All && t.At != (Locality{}):
		return indexer.Index{}, nil, errors.New("a locality narrows the answer of a key or a chain key, not a whole index")
	case t.Cluster != "" && (t.All || t.Key == ""):
		return indexer.Index{}, nil, errors.New("a cluster narrows the answer of a key or a chain key, not a whole index")
	case t.Cluster != "" && !v.hasCluster(t.Cluster):
		return indexer.Index{}, nil, unknownCluster(v, t.Cluster)
	case t.Chain != "" && t.Index == "" && !t.All:
		ch, ok := v.chains[t.Chain]
		if !ok {
			return indexer.Index{}, nil, fmt.Errorf("unknown chain %q", t.Chain)
		}
		return indexer.Index{}, ch.steps, nil
	case t.Index != "" && t.Chain == "":
		ix, ok := snap.Index(t.Index)
		if _, listed := v.byIndex[t.Index]; !ok || !listed {
			return indexer.Index{}, nil, fmt.Errorf("unknown index %q", t.Index)
		}
		return ix, nil, nil
	}
	return indexer.Index{}, nil, errors.New("a target names an index or a chain (use KeyOf, ChainOf or IndexOf)")
}

// reconfigure follows a reload, once the store's Reconfigure returned
// (its commit hook has run, see relayout: latest holds the new layout):
// the registrations on retired indexes go; a subscription whose target
// the new view lacks is told it is gone, one whose target reads other
// indexes now is told to bind again (Next does it), and every one is
// woken, so that one waiting for a watcher that a reload replaced waits
// for the new one.
//
// latest is not moved to the store's current snapshot: commits published
// since may not have had their hook called yet, and would then be marked
// as changes from before what the subscriber was given.
func (h *hub) reconfigure(e *Engine, retired []indexer.Index) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, snap := e.view()
	for s := range h.subs {
		ix, steps, err := bindingOf(v, snap, s.target)
		s.mu.Lock()
		switch {
		case err != nil:
			s.gone = true
		case ix != s.ix || !slices.Equal(steps, s.steps):
			s.rebind = true
			h.holdBase(s)
		}
		s.mu.Unlock()
		s.wake()
	}
	for _, ix := range retired {
		delete(h.indexes, ix)
	}
}

// relayout follows a reload's commit, in commit order (before any later
// commit's): an index whose answers are read through other companions
// now (its fallback or hints dropped or replaced) answers otherwise with
// no commit naming its keys. Every subscription of it compares its
// answer anew (an index subscription its whole index, from what it held
// at prev), and its journal, which cannot tell which keys changed,
// starts over: a resume from before is a reset. Under mu.
func (h *hub) relayout(prev, next *indexer.Snapshot) {
	for ix, is := range h.indexes {
		if next.SameCompanions(prev, ix) {
			continue
		}
		if is.journal != nil {
			is.journal.reset(next.Seq())
		}
		for s := range is.all {
			s.markWhole(ix, prev, next)
		}
		if len(is.all) > 0 {
			is.at = next
		}
		for _, subs := range is.keys {
			for s := range subs {
				s.mark()
			}
		}
	}
}

// holdBase gives a caught-up index subscription that a reload moves to
// another index the snapshot of what it holds, read from its index's
// shared one before the index is retired: the rebound subscription then
// sends only what differs. Under mu and s.mu.
func (h *hub) holdBase(s *Subscription) {
	if !s.target.All || s.base != nil {
		return
	}
	if is := h.indexes[s.ix]; is != nil && is.at != nil {
		if _, in := is.all[s]; in {
			s.base, s.baseIx = is.at, s.ix
		}
	}
}

// rebind binds s to what its target reads in the current view, moves its
// registrations there, and makes its next step compare the answer anew.
// ok is false when the target is gone. Called by Next.
func (h *hub) rebind(s *Subscription, registered bool) (ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, snap := s.e.view()
	ix, steps, err := bindingOf(v, snap, s.target)
	if err != nil {
		return false
	}
	if registered {
		s.mu.Lock()
		h.holdBase(s)
		s.mu.Unlock()
	}
	h.drop(s)
	s.ix, s.steps = ix, steps
	if !registered {
		return true // the first step registers it
	}
	switch {
	case s.target.All:
		is := h.subsOf(ix)
		if is.journal == nil {
			is.journal = &journal{entries: make([]journalEntry, journalSize), floor: h.latest.Seq()}
		}
		is.all[s] = struct{}{}
		if is.at == nil {
			is.at = h.latest
		}
		s.mu.Lock()
		s.pending, s.overflow, s.pendAt = nil, true, h.latest
		s.mu.Unlock()
	case s.steps == nil:
		is := h.subsOf(ix)
		is.addKey(s, s.target.Key)
		s.path = map[indexer.Index]map[string]struct{}{ix: {s.target.Key: {}}}
		s.mu.Lock()
		s.dirty = true
		s.mu.Unlock()
	default:
		s.mu.Lock()
		s.dirty = true // the next step resolves and registers the path
		s.mu.Unlock()
	}
	return true
}

// unregister removes every registration of s.
func (h *hub) unregister(s *Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
	h.drop(s)
}

// drop removes the registrations of s on keys and on its index; under mu.
func (h *hub) drop(s *Subscription) {
	for ix, keys := range s.path {
		for k := range keys {
			h.dropKey(s, ix, k)
		}
	}
	s.path = nil
	if is := h.indexes[s.ix]; is != nil {
		delete(is.all, s)
		if len(is.all) == 0 {
			is.at = nil
		}
	}
}

// newEpoch names one run of an engine in its versions: a version of
// another run, or of before a restart, cannot be resumed from.
func newEpoch() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// version formats the version of seq.
func (e *Engine) version(seq uint64) string { return e.epoch + ":" + strconv.FormatUint(seq, 10) }

// parseVersion reads a version of this engine: its seq and its third part
// (a key or chain answer's hash, or an index's tag).
func (e *Engine) parseVersion(v string) (seq uint64, hash string, ok bool) {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] != e.epoch {
		return 0, "", false
	}
	seq, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return 0, "", false
	}
	if len(parts) == 3 {
		if parts[2] == "" || parts[2] == "partial" {
			return 0, "", false
		}
		hash = parts[2]
	}
	return seq, hash, true
}

// SubscriptionStats counts the engine's subscriptions.
type SubscriptionStats struct {
	Open      int64 // subscriptions not closed
	Coalesced int64 // changes folded into a newer one before a subscriber took them
	Resets    int64 // resumes that could not resume and started over
}

// Subscriptions counts the engine's subscriptions.
func (e *Inspector) Subscriptions() SubscriptionStats {
	return SubscriptionStats{Open: e.hub.opened.Load(), Coalesced: e.hub.coalesced.Load(), Resets: e.hub.resets.Load()}
}
