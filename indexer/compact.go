package indexer

import "slices"

// Compact moves the pages of every index's table into fresh memory, the
// pages of each chunk (64 pages) into one array, and publishes the result:
// the same keys and values, so no index key changes (the OnCommit hook is
// called with no changes, so that it can drop the old snapshot).
//
// Why: a write copies the pages it changes (a few kilobytes each), and
// after much churn the pages that are current lie scattered among the
// spans of the Go heap that the old copies filled, one live page keeping a
// span of several resident. An array per chunk gives those spans back to
// the collector.
//
// The price: while any page of an array is current, the array stays, with
// the keys and values its replaced pages pointed to. So Compact is for
// when writes have quieted (the daemon calls it once they have paused,
// before it returns free memory to the kernel), and it compacts only after
// writes in number at least a quarter of the tables' pages since the last
// Compact (see Snapshot.Writes: commits that changed no table do not
// count): memory follows the state again at the next pause, and a quiet
// store is never copied twice. It reports whether it compacted.
//
// The writer's sets of objects (a slot for each, see objectSet) are
// moved likewise, under every source's writer lock. The copy of the
// tables' pages, not of the keys and values they hold, is made without
// them: a write that comes meanwhile wins, and Compact gives up (false);
// so does Compact when some source's writer is at work (it never waits
// for one, and no writer waits for a source's work behind it). Readers
// never wait.
func (s *Store) Compact() bool { return s.compact(false) }

// compact is Compact; force compacts whatever was written since the last.
func (s *Store) compact(force bool) bool {
	defer s.runHooks() // once every lock is let go
	old := s.current.Load()
	if !force && (old.compacted || old.writes-old.compactedAt < worthCompacting(old)) {
		return false
	}
	indexes := slices.Clone(old.indexes)
	for id, is := range old.indexes {
		if is == emptyIndex {
			continue
		}
		c := *is
		c.values = is.values.compacted()
		if is.objects != nil {
			o := is.objects.compacted()
			c.objects = &o
		}
		indexes[id] = &c
	}
	s.wide.Lock()
	defer s.wide.Unlock()
	var srcs []*Source
	if force {
		srcs = s.lockSources()
	} else {
		// No waiting for a writer at work while holding the locks of
		// others, whose writers would wait: its write wins.
		for _, src := range s.sources {
			if !src.mu.TryLock() {
				for _, held := range srcs {
					held.mu.Unlock()
				}
				return false
			}
			srcs = append(srcs, src)
		}
	}
	defer func() {
		for _, src := range srcs {
			src.mu.Unlock()
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current.Load() != old {
		return false
	}
	for _, src := range srcs {
		if !src.removed {
			src.objects.compact()
		}
	}
	next := old.derive()
	next.indexes = indexes
	next.compacted = true
	next.compactedAt = old.writes
	s.publish(next, nil, true, srcs...)
	s.queueHook(old, next, func() []Change { return nil })
	return true
}

// worthCompacting is the number of writes after which Compact copies the
// tables of snap: a quarter of their pages (at least 64).
func worthCompacting(snap *Snapshot) uint64 {
	pages := 0
	for _, is := range snap.indexes {
		if is == emptyIndex {
			continue
		}
		pages += 1 << is.values.bits
		if is.objects != nil {
			pages += 1 << is.objects.bits
		}
	}
	return uint64(max(64, pages/4))
}

// compacted returns a copy of t whose pages sit in one array per chunk.
// A page is a full slice expression of its array: an update copies a page
// before changing it, never appends to one. Each chunk is allocated on its
// own: in one array of chunks, a chunk that no write has copied yet would
// keep the stale entries of all the others, and every page array they
// point to.
func (t *table) compacted() table {
	out := table{bits: t.bits, dir: make([]*chunk, len(t.dir))}
	for ci, c := range t.dir {
		nc := new(chunk)
		groups := 0
		for _, p := range c {
			if !isEmptyPage(p) {
				groups += len(p)
			}
		}
		block := make([]group, groups)
		off := 0
		for j, p := range c {
			if isEmptyPage(p) {
				nc[j] = emptyPage
				continue
			}
			q := block[off : off+len(p) : off+len(p)]
			copy(q, p)
			nc[j] = q
			off += len(p)
		}
		out.dir[ci] = nc
	}
	return out
}

// isEmptyPage reports whether p is the shared empty page.
func isEmptyPage(p []group) bool { return len(p) == 1 && &p[0] == &emptyPage[0] }
