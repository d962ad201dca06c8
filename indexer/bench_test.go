package indexer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// benchKeys builds a store of n objects with 3 keys each, like AppModels
// with 3 models, and the plain map[string][]string of the same content.
func benchStore(b *testing.B, n int) (*Store, Index, map[string][]string, []string) {
	b.Helper()
	s, err := New(SourceSpec{Name: "apps", Indexes: []string{"model-to-app"}})
	if err != nil {
		b.Fatal(err)
	}
	src := s.Source("apps")
	objs := make([]Object, n)
	plain := make(map[string][]string, 3*n)
	keys := make([]string, 0, 3*n)
	for i := range n {
		name := fmt.Sprintf("app-%06d", i)
		var es []Entry
		for j := range 3 {
			k := fmt.Sprintf("model-%06d-%d", i, j)
			es = append(es, Entry{Key: k, Value: name})
			// The map owns copies of its keys, as any index built from
			// decoded objects does: a query never shares its key's memory.
			plain[strings.Clone(k)] = []string{name}
			keys = append(keys, k)
		}
		objs[i] = Object{Key: "ns/" + name, Entries: [][]Entry{es}}
	}
	src.Replace(objs)
	ix, _ := s.Index("model-to-app")
	// The queries are strings of their own, as a request's key is: not the
	// strings the map or the index hold, nor next to them in memory (a
	// query key allocated next to the map's copy of it would share its
	// cache line and favor the map).
	for i, k := range keys {
		keys[i] = strings.Clone(k)
	}
	rand.New(rand.NewPCG(1, 1)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return s, ix, plain, keys
}

var sink []string

func BenchmarkLookup(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		s, ix, plain, keys := benchStore(b, n)
		hot := keys[0]
		b.Run(fmt.Sprintf("objects=%d/hot/map", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink = plain[hot]
			}
		})
		b.Run(fmt.Sprintf("objects=%d/hot/index", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink = ix.Lookup(hot)
			}
		})
		b.Run(fmt.Sprintf("objects=%d/random/map", n), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				sink = plain[keys[i%len(keys)]]
				i++
			}
		})
		b.Run(fmt.Sprintf("objects=%d/random/index", n), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				sink = ix.Lookup(keys[i%len(keys)])
				i++
			}
		})
		b.Run(fmt.Sprintf("objects=%d/random/by-name", n), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				sink = s.Lookup("model-to-app", keys[i%len(keys)])
				i++
			}
		})
		b.Run(fmt.Sprintf("objects=%d/random-parallel/map", n), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := rand.IntN(len(keys))
				var s []string
				for pb.Next() {
					s = plain[keys[i%len(keys)]]
					i++
				}
				_ = s
			})
		})
		b.Run(fmt.Sprintf("objects=%d/random-parallel/index", n), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := rand.IntN(len(keys))
				var s []string
				for pb.Next() {
					s = ix.Lookup(keys[i%len(keys)])
					i++
				}
				_ = s
			})
		})
	}
}

// BenchmarkPut updates one object of 100k per op, moving it to a key of
// its own: the cost of a watch event.
func BenchmarkPut(b *testing.B) {
	s, _, _, _ := benchStore(b, 100_000)
	src := s.Source("apps")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tx := src.Begin()
		name := fmt.Sprintf("app-%06d", i%100_000)
		tx.Put(Object{Key: "ns/" + name, Entries: [][]Entry{{{Key: fmt.Sprintf("moved-%06d-%d", i%100_000, i), Value: name}}}})
		tx.Commit()
		i++
	}
}

// BenchmarkCreateDelete creates an object among 100k and deletes it: a
// new object key's probe of the writer's set to an empty slot, and a
// delete's shift of the records after it.
func BenchmarkCreateDelete(b *testing.B) {
	s, _, _, _ := benchStore(b, 100_000)
	src := s.Source("apps")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		key := fmt.Sprintf("ns/new-%d", i)
		tx := src.Begin()
		tx.Put(Object{Key: key, Entries: [][]Entry{{{Key: fmt.Sprintf("new-model-%d", i), Value: key}}}})
		tx.Commit()
		tx = src.Begin()
		tx.Delete(key)
		tx.Commit()
		i++
	}
}

// BenchmarkPutHotKey adds and removes values of one key that 10k objects
// share: the write copies that key's values.
func BenchmarkPutHotKey(b *testing.B) {
	s, _, _, _ := benchStore(b, 100_000)
	src := s.Source("apps")
	tx := src.Begin()
	for i := range 10_000 {
		name := fmt.Sprintf("app-%06d", i)
		tx.Put(Object{Key: "ns/" + name, Entries: [][]Entry{{{Key: "hot", Value: name}}}})
	}
	tx.Commit()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tx := src.Begin()
		name := fmt.Sprintf("app-%06d", i%10_000)
		tx.Put(Object{Key: "ns/" + name, Entries: [][]Entry{{{Key: "hot", Value: fmt.Sprintf("v-%d", i)}}}})
		tx.Commit()
		i++
	}
}

func BenchmarkReplace(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			s, _, _, _ := benchStore(b, n)
			src := s.Source("apps")
			objs := make([]Object, n)
			for i := range n {
				name := fmt.Sprintf("app-%06d", i)
				objs[i] = Object{Key: "ns/" + name, Entries: [][]Entry{{{Key: "m-" + name, Value: name}, {Key: "n-" + name, Value: name}}}}
			}
			b.ReportAllocs()
			for b.Loop() {
				src.Replace(objs)
			}
		})
	}
}

// BenchmarkReplaceAllChanged is a relist in which every object changed
// its keys: one transaction that changes every key of every page (the
// replaced keys removed, the new ones inserted), which lays each page out
// anew.
func BenchmarkReplaceAllChanged(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			s, _, _, _ := benchStore(b, n)
			src := s.Source("apps")
			lists := [2][]Object{make([]Object, n), make([]Object, n)}
			for i := range n {
				name := fmt.Sprintf("app-%06d", i)
				for v, l := range lists {
					l[i] = Object{Key: "ns/" + name, Entries: [][]Entry{{{Key: fmt.Sprintf("m%d-%s", v, name), Value: name}, {Key: fmt.Sprintf("n%d-%s", v, name), Value: name}}}}
				}
			}
			b.ReportAllocs()
			v := 0
			for b.Loop() {
				list := slices.Clone(lists[v])
				src.Replace(list)
				v = 1 - v
			}
		})
	}
}

// BenchmarkRelayout is one write that lays a page out anew: a key added
// to a page of 56 keys in 64 slots, which a copy in place would fill past
// 7/8.
func BenchmarkRelayout(b *testing.B) {
	hs := newHashSeed(1)
	changes := make([]change, 56)
	for i := range changes {
		k := fmt.Sprintf("model-%06d", i)
		changes[i] = change{hash: hashKey(hs, k), key: k, values: []string{"app"}}
	}
	page := layout(changes)
	if len(page)*groupSlots != 64 {
		b.Fatalf("page of %d slots, want 64", len(page)*groupSlots)
	}
	k := "model-new"
	add := []change{{hash: hashKey(hs, k), key: k, values: []string{"app"}}}
	b.ReportAllocs()
	for b.Loop() {
		if p, _ := updatePage(hs, page, add); len(p) == len(page) {
			b.Fatal("the page was not laid out anew")
		}
	}
}

// BenchmarkRebuildIndexes fills an empty source of 10,000 objects that
// feeds three indexes, two keys each, with the objects behind each key
// kept: a bulk build that reads every index of every object.
func BenchmarkRebuildIndexes(b *testing.B) {
	const n = 10_000
	objs := make([]Object, n)
	for i := range n {
		name := fmt.Sprintf("app-%06d", i)
		objs[i] = Object{Key: "ns/" + name, Entries: [][]Entry{
			{{Key: fmt.Sprintf("model-%06d-0", i), Value: name}, {Key: fmt.Sprintf("model-%06d-1", i), Value: name}},
			{{Key: fmt.Sprintf("type-%d", i%7), Value: name}, {Key: fmt.Sprintf("team-%d", i%50), Value: name}},
			{{Key: fmt.Sprintf("version-%d", i%3), Value: "ns/" + name}, {Key: fmt.Sprintf("zone-%d", i%2), Value: name}},
		}}
	}
	benchRebuild(b, SourceSpec{Name: "apps", Indexes: []string{"models", "types", "versions"}, Objects: true}, objs)
}

// benchRebuild times the Replace that fills an empty source of spec with
// objs (prepared beforehand, out of the timing), in a new store each time.
func benchRebuild(b *testing.B, spec SourceSpec, objs []Object) {
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		s, err := New(spec)
		if err != nil {
			b.Fatal(err)
		}
		list := slices.Clone(objs)
		src := s.Source(spec.Name)
		for i := range list {
			src.Prepare(&list[i])
		}
		b.StartTimer()
		src.Replace(list)
	}
}

// BenchmarkRebuild fills an empty source from a full list: an initial
// sync.
func BenchmarkRebuild(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			objs := make([]Object, n)
			for i := range n {
				name := fmt.Sprintf("app-%06d", i)
				objs[i] = Object{Key: "ns/" + name, Entries: [][]Entry{{
					{Key: fmt.Sprintf("model-%06d-0", i), Value: name},
					{Key: fmt.Sprintf("model-%06d-1", i), Value: name},
					{Key: fmt.Sprintf("model-%06d-2", i), Value: name}}}}
			}
			benchRebuild(b, SourceSpec{Name: "apps", Indexes: []string{"model-to-app"}}, objs)
		})
	}
}

// BenchmarkCompact is what a Compact costs on an index of 100,000
// objects (300,000 keys): the copy of its pages, made without the writer
// lock.
func BenchmarkCompact(b *testing.B) {
	s, _, _, _ := benchStore(b, 100_000)
	b.ReportAllocs()
	for b.Loop() {
		if !s.compact(true) {
			b.Fatal("did not compact")
		}
	}
}

// BenchmarkReconfigure is the store's part of a config reload, with a
// source of 100k objects (300k keys) and a second, small one: a reload
// that keeps both (the common case: another resource was added or
// removed), and one that gives the large source an index more and takes
// it away again (two relayouts: every object re-encoded).
func BenchmarkReconfigure(b *testing.B) {
	s, _, _, _ := benchStore(b, 100_000)
	small := SourceSpec{Name: "svc", Indexes: []string{"svc-to-ip"}}
	keep := []SourceSpec{{Name: "apps", Indexes: []string{"model-to-app"}}, small}
	grown := []SourceSpec{{Name: "apps", Indexes: []string{"model-to-app", "extra"}}, small}
	if _, err := s.Reconfigure(keep, nil); err != nil {
		b.Fatal(err)
	}
	b.Run("keep", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = s.Reconfigure(keep, nil)
		}
	})
	b.Run("relayout", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = s.Reconfigure(grown, nil)
			_, _ = s.Reconfigure(keep, nil)
		}
	})
}

// BenchmarkExplain is the cost of one Explain of a key: a read of every
// object of the source, under the writer lock (writers wait that long).
func BenchmarkExplain(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			s, ix, _, keys := benchStore(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				s.Explain(func(x *Explainer) {
					if len(x.Claims(ix, keys[i%len(keys):i%len(keys)+1])) != 1 {
						b.Fatal("no claim")
					}
				})
			}
		})
	}
}

// BenchmarkMovingClaimant is one write of an object that moves, at each
// write, to a key that another object holds (AppModel-like objects, each
// the older holder of its three models, its name as their value): in a
// unique index (a conflict found and settled at each write) and in the
// same index without unique. Before claimants were found by name, the
// unique index read every object at each write.
func BenchmarkMovingClaimant(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		for _, unique := range []bool{false, true} {
			b.Run(fmt.Sprintf("objects=%d/unique=%v", n, unique), func(b *testing.B) {
				spec := SourceSpec{Name: "s", Indexes: []string{"ix"}}
				if unique {
					spec.Unique = []string{"ix"}
				}
				moveClaimant(b, spec, appModelObjects(n, "metasync-bench/", true))
			})
		}
	}
}

// moveClaimant is the loop of BenchmarkMovingClaimant: a store of spec
// holding objs (appModelObjects), and an object that moves to the next
// model key at each write.
func moveClaimant(b *testing.B, spec SourceSpec, objs []Object) {
	s, err := New(spec)
	if err != nil {
		b.Fatal(err)
	}
	src := s.Source("s")
	n := len(objs)
	src.Replace(objs)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("model-%06d-%d", i, i%3)
	}
	meta := Meta{Version: "1", Created: 1764000001}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tx := src.Begin()
		tx.Put(Object{Key: "metasync-bench/mover", Meta: meta, Entries: [][]Entry{{{Key: keys[i%n], Value: "mover"}}}})
		tx.Commit()
		i++
	}
}

// BenchmarkWriteWhileExplained is one write to a source, timed until a
// lookup answers it, while another goroutine explains keys of another
// source of the same store in a loop (an explain flood): the time a
// writer loses to explanations.
func BenchmarkWriteWhileExplained(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			s, err := New(SourceSpec{Name: "a", Indexes: []string{"a"}}, SourceSpec{Name: "b", Indexes: []string{"b"}})
			if err != nil {
				b.Fatal(err)
			}
			s.Source("a").Replace(appModelObjects(n, "metasync-bench/", true))
			ixA, _ := s.Index("a")
			ixB, _ := s.Index("b")
			keys := s.Snapshot().Keys(ixA)
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					s.Explain(func(x *Explainer) { x.Claims(ixA, keys[i%len(keys):i%len(keys)+1]) })
				}
			}()
			src := s.Source("b")
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				v := strconv.Itoa(i)
				tx := src.Begin()
				tx.Put(Object{Key: "ns/b", Entries: [][]Entry{{{Key: "k", Value: v}}}})
				tx.Commit()
				for got := ixB.Lookup("k"); len(got) != 1 || got[0] != v; got = ixB.Lookup("k") {
				}
			}
			b.StopTimer()
			close(stop)
			<-done
		})
	}
}

// BenchmarkMovingClaimantAnyValue is BenchmarkMovingClaimant where the
// holders' values name no object (the holder of model-X gives "svc-X"),
// so that a key's claimants cannot be found by name: with the object keys
// per index key kept (objects=true, as the engine keeps them for a
// resource with fields or of several clusters) they are read from there;
// without, from every object of the source.
func BenchmarkMovingClaimantAnyValue(b *testing.B) {
	const n = 100_000
	for _, objects := range []bool{false, true} {
		for _, unique := range []bool{false, true} {
			b.Run(fmt.Sprintf("objects=%v/unique=%v", objects, unique), func(b *testing.B) {
				spec := SourceSpec{Name: "s", Indexes: []string{"ix"}, Objects: objects}
				if unique {
					spec.Unique = []string{"ix"}
				}
				objs := appModelObjects(n, "metasync-bench/", true)
				for i := range objs {
					for j := range objs[i].Entries[0] {
						objs[i].Entries[0][j].Value = "svc-" + objs[i].Entries[0][j].Value
					}
				}
				moveClaimant(b, spec, objs)
			})
		}
	}
}

// BenchmarkManyConflicts is a write whose object moves, as a third
// claimant, from one key in conflict of a unique index to the next, while
// 50,000 keys are in conflict: each write changes what two of them hold
// (their claimants' values), and copies the chosen answers of the shards
// that hold them, not all.
func BenchmarkManyConflicts(b *testing.B) {
	const n = 50_000
	s, err := New(SourceSpec{Name: "s", Indexes: []string{"ix"}, Unique: []string{"ix"}, Objects: true})
	if err != nil {
		b.Fatal(err)
	}
	src := s.Source("s")
	objs := make([]Object, 0, 2*n)
	for i := range n {
		k := fmt.Sprintf("key-%06d", i)
		objs = append(objs,
			Object{Key: fmt.Sprintf("ns/holder-%06d", i), Meta: Meta{Created: 1}, Entries: [][]Entry{{{Key: k, Value: "holder"}}}},
			Object{Key: fmt.Sprintf("ns/rival-%06d", i), Meta: Meta{Created: 2}, Entries: [][]Entry{{{Key: k, Value: "rival"}}}})
	}
	src.Replace(objs)
	ix, _ := s.Index("ix")
	if c := s.Snapshot().ConflictCount(ix); c != n {
		b.Fatalf("%d keys in conflict, want %d", c, n)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tx := src.Begin()
		tx.Put(Object{Key: "ns/mover", Meta: Meta{Created: 3}, Entries: [][]Entry{{{Key: fmt.Sprintf("key-%06d", i%n), Value: "mover"}}}})
		tx.Commit()
		i++
	}
}
