package indexer

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestObjectSetMatchesMap: random puts (new keys and replacements) and
// deletes, through growth and shrinking, against a map; after each step
// every key of the map is found with its encoding, the count agrees, and
// All yields exactly the map.
func TestObjectSetMatchesMap(t *testing.T) {
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, seed))
		m := newObjectSet(newHashSeed(seed), 0)
		want := map[string]string{}
		// Few distinct keys in some seeds (dense clusters, many shifts),
		// many in others (growth and shrinking).
		space := []int{20, 3000}[seed%2]
		for step := range 6000 {
			key := fmt.Sprintf("ns/obj-%d", r.IntN(space))
			if step > 4000 {
				// Drain: the table shrinks.
				if _, ok := want[key]; ok || r.IntN(4) > 0 {
					m.Delete(key)
					delete(want, key)
					continue
				}
			}
			if r.IntN(3) == 0 {
				m.Delete(key)
				delete(want, key)
			} else {
				entries := [][]Entry{{{Key: fmt.Sprint("k", step), Value: "v"}}}
				rec, k, enc := newRecord(key, encodeMeta(nil, Meta{Version: fmt.Sprint(step)}), entries)
				if k != key {
					t.Fatalf("record's key %q, want %q", k, key)
				}
				_, had := want[key]
				if isNew := m.Put(rec); isNew == had {
					t.Fatalf("step %d: Put(%q) new %v, had %v", step, key, isNew, had)
				}
				want[key] = enc
			}
			if m.Len() != len(want) {
				t.Fatalf("step %d: Len %d, want %d", step, m.Len(), len(want))
			}
			if step%97 == 0 || step > 5900 {
				for k, enc := range want {
					if got, ok := m.Get(k); !ok || got != enc {
						t.Fatalf("step %d: Get(%q) = %q, %v; want %q", step, k, got, ok, enc)
					}
				}
				seen := 0
				for k, enc := range m.All() {
					if want[k] != enc {
						t.Fatalf("step %d: All yields %q, %q; want %q", step, k, enc, want[k])
					}
					seen++
				}
				if seen != len(want) {
					t.Fatalf("step %d: All yields %d, want %d", step, seen, len(want))
				}
			}
		}
		if _, ok := m.Get("ns/absent"); ok {
			t.Fatal("found an absent key")
		}
		if m.size > slotsFor(m.Len())*8 {
			t.Fatalf("%d slots hold %d objects: the table did not shrink", m.size, m.Len())
		}
	}
}

// TestRecordLongParts: object keys and encodings past one byte's varint
// length split back exactly.
func TestRecordLongParts(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 300, 20000} {
		key := fmt.Sprintf("%0*d", max(n, 1), 7)
		entries := [][]Entry{{{Key: key + "k", Value: key}}}
		rec, k, enc := newRecord(key, encodeMeta(nil, Meta{Version: key}), entries)
		if k != key {
			t.Fatalf("n=%d: key %d bytes, want %d", n, len(k), len(key))
		}
		if got := recordAt(&[]byte(rec)[0]); got != rec {
			t.Fatalf("n=%d: recordAt reads %d bytes of %d", n, len(got), len(rec))
		}
		if es := decode(enc, k, 1); len(es[0]) != 1 || es[0][0] != entries[0][0] {
			t.Fatalf("n=%d: decoded %v", n, es)
		}
		if m := decodeMeta(enc); m.Version != key {
			t.Fatalf("n=%d: version %d bytes, want %d", n, len(m.Version), len(key))
		}
	}
}

// TestLongKeysThroughLayouts: keys longer than longKey, whose hash the
// table keeps with them, and short ones, through writes that lay pages
// out anew (growth, deletes, a rehash to more pages and back) and a
// Compact, answer as the same objects built fresh; every key is found by
// a lookup of a string of its own.
func TestLongKeysThroughLayouts(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	key := func(i int) string {
		if i%3 == 0 {
			return fmt.Sprintf("short-%d", i)
		}
		return fmt.Sprintf("%s-%d", strings.Repeat("long", 16+i%40), i)
	}
	obj := func(i, gen int) Object {
		es := []Entry{{Key: key(i), Value: fmt.Sprint("v", gen%3)}, {Key: key(i + 1), Value: "w"}}
		return Object{Key: fmt.Sprint("ns/o-", i), Entries: [][]Entry{es}}
	}
	s, err := New(SourceSpec{Name: "s", Indexes: []string{"ix"}, Objects: true})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("s")
	live := map[int]int{}
	for step := range 6000 {
		// Up to 3,000 objects, then down to a few: pages grow, split
		// over more pages, and shrink back.
		i := r.IntN(3000)
		if step > 4000 {
			i = r.IntN(60)
			for j := range live {
				if j >= 60 {
					tx := src.Begin()
					tx.Delete(fmt.Sprint("ns/o-", j))
					tx.Commit()
					delete(live, j)
					break
				}
			}
		}
		tx := src.Begin()
		if _, ok := live[i]; ok && r.IntN(3) == 0 {
			tx.Delete(fmt.Sprint("ns/o-", i))
			delete(live, i)
		} else {
			tx.Put(obj(i, step))
			live[i] = step
		}
		tx.Commit()
		if step == 3000 {
			s.compact(true)
		}
	}
	f, err := New(SourceSpec{Name: "s", Indexes: []string{"ix"}, Objects: true})
	if err != nil {
		t.Fatal(err)
	}
	var objs []Object
	for i, gen := range live {
		objs = append(objs, obj(i, gen))
	}
	f.Source("s").Replace(objs)
	checkSame(t, s, f, "ix")
	ix, _ := s.Index("ix")
	for i := range live {
		if vs := ix.Lookup(strings.Clone(key(i))); len(vs) == 0 {
			t.Fatalf("key %d (%d bytes) not found", i, len(key(i)))
		}
	}
}

// TestOldRecordsGo: an object's old records become garbage when it
// changes, whatever keeps the keys it touched: a commit hook that holds
// every key it hears of, and the claims and chosen answers of a unique
// index in conflict. Each record here holds a 256 KiB value; after 16
// updates of each of two claimants, the live heap holds the two current
// records, not the history.
func TestOldRecordsGo(t *testing.T) {
	big := func(gen int) string { return fmt.Sprint(gen, strings.Repeat("x", 256<<10)) }
	obj := func(name string, created int64, gen int) Object {
		return Object{Key: "ns/" + name, Meta: Meta{Created: created, Version: fmt.Sprint(gen)}, Entries: [][]Entry{
			{{Key: "contested", Value: name}, {Key: "own-" + name, Value: name}},
			{{Key: fmt.Sprint("gen-", name, gen%2), Value: big(gen)}},
		}}
	}
	s, err := New(SourceSpec{Name: "s", Indexes: []string{"u", "big"}, Unique: []string{"u"}})
	if err != nil {
		t.Fatal(err)
	}
	var heard []string
	s.OnCommit(func(_, _ *Snapshot, changes []Change) {
		for _, c := range changes {
			heard = append(heard, c.Keys...)
		}
	})
	src := s.Source("s")
	put := func(o Object) {
		tx := src.Begin()
		tx.Put(o)
		tx.Commit()
	}
	put(obj("a", 1, 0))
	put(obj("b", 2, 0))
	before := liveHeap()
	for gen := 1; gen <= 16; gen++ {
		put(obj("a", 1, gen))
		put(obj("b", 2, gen))
	}
	after := liveHeap()
	u, _ := s.Index("u")
	if got := u.Lookup("contested"); fmt.Sprint(got) != "[a]" {
		t.Fatalf("contested answers %v, want [a]", got)
	}
	// The tables of "big" hold a copy of each current value (2 × 256
	// KiB) as before; the records the same. Allow one record's worth.
	if grew := int64(after) - int64(before); grew > 256<<10 {
		t.Fatalf("live heap grew by %d KiB over 16 updates of 2 objects: old records are kept (%d keys heard)", grew>>10, len(heard))
	}
	runtime.KeepAlive(heard)
}

// TestPreparedKeyIsTheRecords: an object prepared, then given another
// Key, is written as the object its record names: its old entries are
// withdrawn, and nothing is left behind under the other key.
func TestPreparedKeyIsTheRecords(t *testing.T) {
	s, err := New(SourceSpec{Name: "s", Indexes: []string{"i"}})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("s")
	ix, _ := s.Index("i")
	tx := src.Begin()
	tx.Put(Object{Key: "a", Entries: [][]Entry{{{Key: "k", Value: "old"}}}})
	tx.Commit()
	o := Object{Key: "a", Entries: [][]Entry{{{Key: "k", Value: "new"}}}}
	src.Prepare(&o)
	o.Key = "b"
	tx = src.Begin()
	tx.Put(o)
	tx.Commit()
	if got := ix.Lookup("k"); fmt.Sprint(got) != "[new]" {
		t.Fatalf("k answers %v, want [new]", got)
	}
	tx = src.Begin()
	tx.Delete("a")
	tx.Commit()
	if got, n := ix.Lookup("k"), s.Snapshot().ObjectCount(src); got != nil || n != 0 {
		t.Fatalf("after the delete: k answers %v, %d objects", got, n)
	}
}

// FuzzEncodingRoundTrip: whatever an object's entries (keys sharing
// beginnings or not, a key repeated with several values, empty keys and
// values, values equal to the object key, to its name or to the previous
// one), decode gives back exactly the normalized entries that encode was
// given, and the provenance.
func FuzzEncodingRoundTrip(f *testing.F) {
	f.Add("ns/app", "model-1 app\nmodel-2 app\nmodel-10 ns/app\nmodel-1 other", int64(1764000000), "12345")
	f.Add("app", "iiot_data_query app\niiot_dataservice app\niiot_edge_project app", int64(0), "v1")
	f.Add("ns/", " \n x\nx \nxx xx", int64(-1), "")
	f.Fuzz(func(t *testing.T, objectKey, lines string, created int64, version string) {
		var entries [][]Entry
		var es []Entry
		for _, line := range strings.Split(lines, "\n") {
			if line == "--" {
				entries, es = append(entries, normalize(es)), nil
				continue
			}
			k, v, _ := strings.Cut(line, " ")
			es = append(es, Entry{Key: k, Value: v})
		}
		entries = append(entries, normalize(es))
		meta := Meta{Version: version, Created: created}
		rec, key, enc := newRecord(objectKey, encodeMeta(nil, meta), entries)
		if k, e := splitRecord(rec); k != objectKey || key != objectKey || e != enc {
			t.Fatalf("record splits into %q, %q", k, e)
		}
		got := decode(enc, key, len(entries))
		for i := range entries {
			if len(got[i]) != len(entries[i]) {
				t.Fatalf("index %d: %d entries decoded, want %d", i, len(got[i]), len(entries[i]))
			}
			for j := range entries[i] {
				if got[i][j] != entries[i][j] {
					t.Fatalf("index %d entry %d: %q, want %q", i, j, got[i][j], entries[i][j])
				}
			}
		}
		// Skipping the indexes before one, then decoding it, gives what
		// decoding them all gives (a bulk build reads one index at a time).
		_, rest := splitMeta(enc)
		for i := range entries {
			es, _ := decodeEntries(nil, rest, key, objectName(key), new([]byte))
			if !slices.Equal(es, got[i]) {
				t.Fatalf("index %d alone: %q, want %q", i, es, got[i])
			}
			var n int
			if n, rest = skipEntries(rest); n != len(entries[i]) {
				t.Fatalf("index %d: %d entries skipped, want %d", i, n, len(entries[i]))
			}
		}
		if rest != "" {
			t.Fatalf("%d bytes after the last index", len(rest))
		}
		m := decodeMeta(enc)
		if want := max(created, 0); m.Created != want || m.Version != version {
			t.Fatalf("provenance %+v, want created %d version %q", m, want, version)
		}
		if createdOf(enc) != max(created, 0) {
			t.Fatalf("createdOf %d, want %d", createdOf(enc), max(created, 0))
		}
	})
}

// TestScanRebuildsKeysInLittleRoom: a scan of every object for the
// claimants of a key (a unique index's key gaining a second value)
// rebuilds the front-coded keys of each object in room sized for them,
// not for the rest of its encoding: 2,000 objects with 30 KiB values in
// another index cost one scan a few megabytes at most, not the 60 MB the
// values would.
func TestScanRebuildsKeysInLittleRoom(t *testing.T) {
	s, err := New(SourceSpec{Name: "s", Indexes: []string{"a", "u"}, Unique: []string{"u"}})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("s")
	big := strings.Repeat("v", 30<<10)
	objs := make([]Object, 2000)
	for i := range objs {
		objs[i] = Object{Key: fmt.Sprint("ns/o", i), Meta: Meta{Created: int64(1 + i)}, Entries: [][]Entry{
			{{Key: "app-1", Value: "v"}, {Key: "app-2", Value: "v"}, {Key: "zzz", Value: big}},
			{{Key: fmt.Sprint("u", i), Value: "x"}},
		}}
	}
	src.Replace(objs)
	scans := src.scans
	o := Object{Key: "ns/other", Meta: Meta{Created: 99999}, Entries: [][]Entry{nil, {{Key: "u5", Value: "y"}}}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	tx := src.Begin()
	tx.Put(o)
	tx.Commit()
	runtime.ReadMemStats(&after)
	if src.scans != scans+1 {
		t.Fatalf("%d scans, want 1", src.scans-scans)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Fatalf("one conflicting write allocated %d KiB", got>>10)
	}
	u, _ := s.Index("u")
	if got := u.Lookup("u5"); fmt.Sprint(got) != "[x]" {
		t.Fatalf("u5 answers %v, want the older claimant's [x]", got)
	}
}
