package sync

// A subscription to a whole index (Target.All): its initial state (every
// key, or what changed since Target.Resume) and its steps.

import "slices"

// stepIndex is step for a subscription to a whole index.
func (s *Subscription) stepIndex() (Event, bool) {
	for {
		if s.phase == phaseStart {
			reset := s.beginIndex()
			if !s.boundIn(s.batch) {
				// Begin again, bound anew, after the reload.
				s.queue, s.phase, s.resumed = nil, phaseStart, false
				return Event{}, false
			}
			if reset {
				return Event{Type: EventReset, Version: s.e.version(s.batch.Seq())}, true
			}
		}
		if len(s.queue) > 0 {
			// Every queued key's values differ from what the subscriber holds.
			key := s.queue[0]
			s.queue = s.queue[1:]
			values := s.batch.Lookup(s.batchIx, key)
			t := EventUpdate
			if s.phase == phaseInitial && !s.resumed {
				t = EventSnapshot
			}
			// Until a batch is whole, the subscriber holds no state that a
			// resume could start from: a partial version resumes nothing.
			version := s.versionOf(s.complete, nil) + ":partial"
			if len(s.queue) == 0 {
				s.queue = nil // the initial snapshot's was the batch's sorted keys
				if t == EventUpdate {
					s.complete = s.batch.Seq()
					version = s.versionOf(s.complete, nil)
					s.settle(version)
					if s.phase == phaseLive {
						s.caughtUp()
					}
				}
			}
			return Event{Type: t, Key: key, Values: values, Version: version}, true
		}
		if s.phase == phaseInitial {
			s.phase = phaseLive
			s.queue = nil // never appended to: it may be the snapshot's keys
			s.complete = s.batch.Seq()
			// A subscription does not hold on to a snapshot it has
			// delivered: an idle one would keep every page that later
			// writes (or a Compact) replaced.
			s.caughtUp()
			v := s.versionOf(s.complete, nil)
			s.settle(v)
			s.synced.Store(true)
			return Event{Type: EventSynced, Version: v}, true
		}
		// Take what the hub marked: every key changed up to pendAt, whose
		// values pendAt holds; queue those whose values differ from what
		// the subscriber holds, the values of base.
		s.mu.Lock()
		pending, at, overflow := s.pending, s.pendAt, s.overflow
		s.pending, s.overflow, s.pendAt = nil, false, nil
		s.mu.Unlock()
		if len(pending) == 0 && !overflow {
			return Event{}, false
		}
		if !s.boundIn(at) {
			return Event{}, false // rebinding compares the whole index
		}
		// Once this batch is delivered the subscriber holds at: what the
		// hub marks from now on is a change from at.
		s.mu.Lock()
		base, baseIx := s.base, s.baseIx
		s.base, s.baseIx = at, s.ix
		s.mu.Unlock()
		held := func(k string) []string {
			if base == nil {
				return nil
			}
			return base.Lookup(baseIx, k)
		}
		s.batch, s.batchIx = at, s.ix
		if overflow {
			// Every key that the subscriber holds or that is there now:
			// the two sorted key lists, merged.
			var had []string
			if base != nil {
				had = base.Keys(baseIx)
			}
			now := at.Keys(s.ix)
			for len(had) > 0 || len(now) > 0 {
				var k string
				switch {
				case len(now) == 0 || len(had) > 0 && had[0] < now[0]:
					k, had = had[0], had[1:]
				case len(had) == 0 || now[0] < had[0]:
					k, now = now[0], now[1:]
				default:
					k, had, now = now[0], had[1:], now[1:]
				}
				if !slices.Equal(at.Lookup(s.ix, k), held(k)) {
					s.queue = append(s.queue, k)
				}
			}
		} else {
			for k := range pending {
				if !slices.Equal(at.Lookup(s.ix, k), held(k)) {
					s.queue = append(s.queue, k)
				}
			}
			slices.Sort(s.queue)
		}
		if len(s.queue) == 0 {
			s.queue = nil
			s.complete = at.Seq()
			s.settle(s.versionOf(s.complete, nil))
			s.caughtUp()
		}
	}
}

// beginIndex registers an index subscription and queues its initial state:
// every key (a snapshot), or what changed since Target.Resume (a resume).
// It reports whether a reset must be sent first: Resume was given and
// cannot be resumed from.
func (s *Subscription) beginIndex() (reset bool) {
	snap, catchUp, ok := s.e.hub.registerIndex(s, s.target.Resume)
	s.batch, s.batchIx = snap, s.ix
	s.phase = phaseInitial
	if s.target.Resume != "" && ok {
		// The subscriber holds the state of Resume: send what differs.
		s.resumed = true
		s.queue = catchUp
		return false
	}
	// The index's sorted keys, made once per state and shared: a stream
	// of the whole index costs no copy of it.
	s.queue = snap.Keys(s.ix)
	if s.target.Resume != "" {
		s.e.hub.resets.Add(1)
		return true
	}
	return false
}
