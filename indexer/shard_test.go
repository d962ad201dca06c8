package indexer

import (
	"fmt"
	"runtime"
	"testing"
)

// shardObjects is the number of objects of the payload shard tests.
const shardObjects = 20_000

// ordinaryName and craftedName name object i. Crafted names share their
// length and their first and last eight bytes, and differ only between:
// a hash of the length and those bytes alone puts them all in one shard,
// as anyone who may create objects could.
func ordinaryName(i int) string { return fmt.Sprintf("ns/app-%06d", i) }
func craftedName(i int) string  { return fmt.Sprintf("ns/craft-%06d-zzzzzzzz", i) }

// payloadStore holds n objects named by name, each with a payload.
func payloadStore(tb testing.TB, n int, name func(int) string) (*Store, *Source) {
	tb.Helper()
	s, err := New(SourceSpec{Name: "apps", Indexes: []string{"model-to-app"}})
	if err != nil {
		tb.Fatal(err)
	}
	src := s.Source("apps")
	objs := make([]Object, n)
	for i := range objs {
		objs[i] = Object{Key: name(i), Payload: i, Entries: [][]Entry{{{Key: fmt.Sprintf("model-%06d", i), Value: name(i)}}}}
	}
	src.Replace(objs)
	return s, src
}

// updatePayload changes the payload of object i: one watch event that
// changes an object's projected fields.
func updatePayload(src *Source, name func(int) string, i, gen int) {
	tx := src.Begin()
	tx.Put(Object{Key: name(i), Payload: gen, Entries: [][]Entry{{{Key: fmt.Sprintf("model-%06d", i), Value: name(i)}}}})
	tx.Commit()
}

// TestCraftedNamesSpreadOverShards: object names chosen to collide under
// an unseeded hash of their length and ends spread over the payload
// shards as ordinary names do, and reach the store again through it.
func TestCraftedNamesSpreadOverShards(t *testing.T) {
	for _, c := range []struct {
		name string
		of   func(int) string
	}{{"ordinary", ordinaryName}, {"crafted", craftedName}} {
		s, src := payloadStore(t, shardObjects, c.of)
		snap := s.Snapshot()
		largest, used := 0, 0
		for _, shard := range snap.source(src).payload {
			largest = max(largest, len(shard))
			if len(shard) > 0 {
				used++
			}
		}
		// 20,000 names over 256 shards: about 78 each. A random spread
		// gives a largest shard near 105; four times the mean is far
		// beyond any seed's chance.
		mean := shardObjects / payloadShards
		if largest > 4*mean || used < payloadShards*9/10 {
			t.Errorf("%s names: largest shard %d (mean %d), %d of %d shards used", c.name, largest, mean, used, payloadShards)
		}
		for _, i := range []int{0, 1, shardObjects / 2, shardObjects - 1} {
			if p, ok := snap.Payload(src, c.of(i)); !ok || p != i {
				t.Errorf("%s names: payload of %q = %v, %v", c.name, c.of(i), p, ok)
			}
		}
	}
}

// TestCraftedNamesUpdateCost: an update of an object with a crafted name
// allocates about what an update with an ordinary name does. With every
// payload in one shard, each update copied that shard: 20,000 entries.
func TestCraftedNamesUpdateCost(t *testing.T) {
	perUpdate := func(name func(int) string) uint64 {
		_, src := payloadStore(t, shardObjects, name)
		const updates = 200
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range updates {
			updatePayload(src, name, (i*7919)%shardObjects, -i)
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / updates
	}
	ordinary, crafted := perUpdate(ordinaryName), perUpdate(craftedName)
	t.Logf("bytes allocated per update: ordinary names %d, crafted names %d", ordinary, crafted)
	if crafted > 2*ordinary+4096 {
		t.Errorf("an update with a crafted name allocates %d bytes, one with an ordinary name %d", crafted, ordinary)
	}
}

// BenchmarkPutPayload updates the payload of one object of 20,000 per op,
// with ordinary names and with names crafted to collide under an unseeded
// shard hash.
func BenchmarkPutPayload(b *testing.B) {
	for _, c := range []struct {
		name string
		of   func(int) string
	}{{"ordinary", ordinaryName}, {"crafted", craftedName}} {
		b.Run("names="+c.name, func(b *testing.B) {
			_, src := payloadStore(b, shardObjects, c.of)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				updatePayload(src, c.of, (i*7919)%shardObjects, -i)
				i++
			}
		})
	}
}
