package indexer

import "slices"

// Compact moves every index's table into fresh memory, each table's pages
// into one array and its chunks into another, and publishes the result:
// the same keys and values, so no index key changes (the OnCommit hook
// is called with no changes, so that it can drop the old snapshot).
//
// Why: a write copies the pages it changes (a few kilobytes each), and
// after much churn the pages that are current lie scattered among the
// spans of the Go heap that the old copies filled, one live page keeping a
// span of several resident. Two large arrays per table give those spans
// back to the collector. A host calls Compact when writes have quieted
// (the daemon does, before it returns free memory to the kernel); it costs
// one copy of the tables' pages, not of the keys and values they hold,
// and waits for writers as a commit does. Readers never wait.
//
// It reports whether it compacted: not when nothing was written since the
// last Compact.
func (s *Store) Compact() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.current.Load()
	if old.compacted {
		return false
	}
	next := old.derive()
	next.compacted = true
	next.indexes = slices.Clone(old.indexes)
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
		next.indexes[id] = &c
	}
	s.publish(next, nil)
	if s.onCommit != nil {
		s.onCommit(old, next, nil)
	}
	return true
}

// compacted returns a copy of t whose pages sit in one array, and whose
// chunks in another. A page is a full slice expression of the array: an
// update copies a page before changing it, never appends to one.
func (t *table) compacted() table {
	groups := 0
	for _, c := range t.dir {
		for _, p := range c {
			if !isEmptyPage(p) {
				groups += len(p)
			}
		}
	}
	block := make([]group, groups)
	chunks := make([]chunk, len(t.dir))
	out := table{bits: t.bits, dir: make([]*chunk, len(t.dir))}
	off := 0
	for ci, c := range t.dir {
		for j, p := range c {
			if isEmptyPage(p) {
				chunks[ci][j] = emptyPage
				continue
			}
			q := block[off : off+len(p) : off+len(p)]
			copy(q, p)
			chunks[ci][j] = q
			off += len(p)
		}
		out.dir[ci] = &chunks[ci]
	}
	return out
}

// isEmptyPage reports whether p is the shared empty page.
func isEmptyPage(p []group) bool { return len(p) == 1 && &p[0] == &emptyPage[0] }
