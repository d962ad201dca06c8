package follow

import (
	"maps"
	"slices"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"
)

// The objects whose rule fails now: a state, where ruleErrors is a
// history. An object leaves it when an event or a list gives it again
// with rules that work, or when it is deleted.

// ruleFailure is what one rule said of one object: the index it failed
// for (its public name: a fallback's and hints' rules count for the index
// they serve) and the error.
type Failure struct {
	Index string
	Err   string
}

// RuleFailure is the last rule error of an index that still holds: the
// object it failed for, what it said and when.
type RuleFailure struct {
	// Object is the object's key: namespace/name, or name when
	// cluster-scoped, never prefixed by its cluster.
	Object string
	Error  string
	At     time.Time
	// Cluster is the object's cluster, for a plan that reads several
	// ("" otherwise).
	Cluster string
}

// FailingSet holds, per public index, the objects whose rule fails now.
// The reflector writes it (put, Delete, Replace), readers read counts.
type FailingSet struct {
	mu gosync.Mutex
	// objects: index → object key → failure; nil when nothing fails.
	objects map[string]map[string]RuleFailure
	// last: index → the failure last recorded, while its object fails.
	last map[string]RuleFailure
	// some: objects is not empty (for note's path without a lock).
	some atomic.Bool
}

// Note sets what fails now for the object key: failed, possibly none.
// An event of a resource none of whose objects fails takes no lock.
func (f *FailingSet) Note(key string, failed []Failure) {
	if len(failed) == 0 && !f.some.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	defer func() { f.some.Store(len(f.objects) > 0) }()
	for index := range f.objects {
		f.remove(index, key)
	}
	f.add(key, failed, time.Now())
}

// Replace sets what fails now for a complete list: every object not in
// it fails no more.
func (f *FailingSet) Replace(failed map[string][]Failure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer func() { f.some.Store(len(f.objects) > 0) }()
	f.objects, f.last = nil, nil
	now := time.Now()
	// In key order: the last failure of a list is its greatest key's,
	// the same at every list.
	for _, key := range slices.Sorted(maps.Keys(failed)) {
		f.add(key, failed[key], now)
	}
}

// keep takes, from an earlier definition of the resource, the failures of
// the indexes that it keeps (same name); a list replaces them.
func (f *FailingSet) keep(old *FailingSet, indexes func(string) bool) {
	old.mu.Lock()
	defer old.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	defer func() { f.some.Store(len(f.objects) > 0) }()
	for index, objs := range old.objects {
		if !indexes(index) {
			continue
		}
		for key, rf := range objs {
			f.put(index, key, rf)
		}
		if rf, ok := old.last[index]; ok {
			f.last[index] = rf
		}
	}
}

func (f *FailingSet) add(key string, failed []Failure, at time.Time) {
	if len(failed) > 0 {
		// A copy of its own: an object's key is a part of the record
		// the indexer keeps of it, which an update replaces.
		key = strings.Clone(key)
	}
	for _, rf := range failed {
		f.put(rf.Index, key, RuleFailure{Object: key, Error: rf.Err, At: at})
		f.last[rf.Index] = RuleFailure{Object: key, Error: rf.Err, At: at}
	}
}

func (f *FailingSet) put(index, key string, rf RuleFailure) {
	if f.objects == nil {
		f.objects, f.last = map[string]map[string]RuleFailure{}, map[string]RuleFailure{}
	}
	objs := f.objects[index]
	if objs == nil {
		objs = map[string]RuleFailure{}
		f.objects[index] = objs
	}
	objs[key] = rf
}

// remove takes key out of index; when it was the last failure recorded,
// the latest of those left takes its place.
func (f *FailingSet) remove(index, key string) {
	objs := f.objects[index]
	if _, ok := objs[key]; !ok {
		return
	}
	delete(objs, key)
	if len(objs) == 0 {
		delete(f.objects, index)
		delete(f.last, index)
		if len(f.objects) == 0 {
			f.objects, f.last = nil, nil
		}
		return
	}
	if f.last[index].Object == key {
		var latest RuleFailure
		for _, rf := range objs {
			if latest.Object == "" || rf.At.After(latest.At) || rf.At.Equal(latest.At) && rf.Object < latest.Object {
				latest = rf
			}
		}
		f.last[index] = latest
	}
}

// Any reports whether an object fails a rule now.
func (f *FailingSet) Any() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.objects) > 0
}

// Counts returns, per index with failures, how many objects fail and the
// last failure.
func (f *FailingSet) Counts() (map[string]int, map[string]RuleFailure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := make(map[string]int, len(f.objects))
	last := make(map[string]RuleFailure, len(f.last))
	for index, objs := range f.objects {
		n[index] = len(objs)
		last[index] = f.last[index]
	}
	return n, last
}
