package indexer

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
)

// FuzzIncrementalEqualsRebuild reads a program of puts, deletes, replaces
// and commits from the fuzzer's bytes, runs it on a Store, and checks after
// every commit that the index equals the model's and a rebuild's.
func FuzzIncrementalEqualsRebuild(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{1, 17, 33, 49, 255, 3, 3, 3, 128, 64})
	f.Add([]byte("put delete replace commit"))
	f.Fuzz(func(t *testing.T, prog []byte) {
		s, src, ix := newStore(t)
		m := model{}
		next := func() int {
			if len(prog) == 0 {
				return 0
			}
			b := prog[0]
			prog = prog[1:]
			return int(b)
		}
		entries := func() []Entry {
			var es []Entry
			for range next() % 4 {
				es = append(es, Entry{Key: fmt.Sprintf("k%d", next()%5), Value: fmt.Sprintf("v%d", next()%3)})
			}
			return es
		}
		check := func() {
			want := m.index()
			if got := dump(s, ix); !reflect.DeepEqual(got, want) {
				t.Fatalf("index = %v, want %v", got, want)
			}
			wantObjs := m.objects()
			for k := range want {
				if got := s.Snapshot().Objects(ix, k); !slices.Equal(got, wantObjs[k]) {
					t.Fatalf("objects of %s = %v, want %v", k, got, wantObjs[k])
				}
			}
			// A rebuild from the model gives the same.
			r, rsrc, rix := newStore(t)
			var objs []Object
			for key, es := range m {
				objs = append(objs, Object{Key: key, Entries: [][]Entry{slices.Clone(es)}})
			}
			rsrc.Replace(objs)
			if got := dump(r, rix); !reflect.DeepEqual(got, want) {
				t.Fatalf("rebuild = %v, want %v", got, want)
			}
			for k := range want {
				if got := r.Snapshot().Objects(rix, k); !slices.Equal(got, wantObjs[k]) {
					t.Fatalf("rebuild: objects of %s = %v, want %v", k, got, wantObjs[k])
				}
			}
			// Deleting the rebuilt objects one at a time leaves what the
			// model says: the rebuild counted a value that two objects
			// give a key as twice.
			rest := maps.Clone(m)
			for _, key := range slices.Sorted(maps.Keys(rest)) {
				tx := rsrc.Begin()
				tx.Delete(key)
				tx.Commit()
				delete(rest, key)
				if got, want := dump(r, rix), rest.index(); !reflect.DeepEqual(got, want) {
					t.Fatalf("rebuild, then %s deleted = %v, want %v", key, got, want)
				}
				for k, want := range rest.objects() {
					if got := r.Snapshot().Objects(rix, k); !slices.Equal(got, want) {
						t.Fatalf("rebuild, then %s deleted: objects of %s = %v, want %v", key, k, got, want)
					}
				}
			}
		}
		tx := src.Begin()
		for len(prog) > 0 {
			key := fmt.Sprintf("o%d", next()%6)
			switch next() % 5 {
			case 0, 1:
				es := entries()
				m[key] = slices.Clone(es)
				tx.Put(Object{Key: key, Entries: [][]Entry{es}})
			case 2:
				tx.Delete(key)
				delete(m, key)
			case 3:
				tx.Commit()
				check()
				tx = src.Begin()
			case 4:
				tx.Commit()
				m = model{}
				var objs []Object
				for range next() % 4 {
					k := fmt.Sprintf("o%d", next()%6)
					es := entries()
					m[k] = slices.Clone(es)
					objs = append(objs, Object{Key: k, Entries: [][]Entry{es}})
				}
				src.Replace(objs)
				check()
				tx = src.Begin()
			}
		}
		tx.Commit()
		check()
	})
}
