package follow

// ForSnapshot returns what a snapshot records of the watcher's data: the
// resourceVersion it is as of, and whether it must be listed rather than
// resumed; ok false when it has no data to write (not synced yet, or
// dropped). verified: the snapshot's cluster was found to be the
// watcher's (see Engine.verified).
func (w *Watcher) ForSnapshot(verified bool) (rv string, relist, ok bool) {
	// The resourceVersion first: the objects exported after it are as
	// of it or newer, and a watch that resumes from it misses nothing
	// (events it repeats change nothing).
	rv = w.ResourceVersion()
	// Objects whose rule fails are not in the snapshot's data: a
	// resource with any is listed at the next start, so that they
	// are found failing again (a resumed watch would not see them).
	// Data read through a connection not listed through yet may be
	// another cluster's (see rotate), and so is that of a cluster that
	// changed behind its address and has not listed since: listed too.
	failing := w.Failing.Any() || w.Reconnected.Load() || w.Changing()
	switch c := w.Carried; {
	case rv == "":
	case w.Listed1():
		return rv, failing, true
	case w.Warm():
		// Data of a snapshot whose cluster was not found to be this
		// one: listed, never resumed, at the next start.
		return rv, w.RestoredRelist || !verified || failing, true
	case c != nil && !w.SnapshotDropped.Load():
		return c.RV, c.Relist || c.Unverified && !verified || failing, true
	}
	return "", false, false
}
