// Lookup speed: the index's lookups and the informer's, against a plain
// map's as the floor, with testing.Benchmark.

package main

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/iidp/metasync/indexer"
)

// benchLookups benchmarks a lookup function over the keys: a hot key,
// random keys on one goroutine, and random keys on every core.
func benchLookups(keys []string, lookup func(string) int) (hot, random, parallel, allocs float64) {
	h := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		k := keys[0]
		for b.Loop() {
			lookup(k)
		}
	})
	r := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			lookup(keys[i%len(keys)])
			i++
		}
	})
	p := testing.Benchmark(func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := rand.IntN(len(keys))
			for pb.Next() {
				lookup(keys[i%len(keys)])
				i++
			}
		})
	})
	return nsPerOp(h), nsPerOp(r), nsPerOp(p), float64(r.AllocsPerOp())
}

// nsPerOp is r's time per operation as a float: testing's NsPerOp rounds
// down to whole nanoseconds.
func nsPerOp(r testing.BenchmarkResult) float64 { return float64(r.T.Nanoseconds()) / float64(r.N) }

// floor is a plain map's lookup time on random keys: on one goroutine, and
// from parallel goroutines.
type floor struct{ single, parallel float64 }

// lookupsVsMap benchmarks the index's lookups and a plain map's, in six
// alternating rounds (the machine's speed drifts from one second to the
// next), and returns the medians of each.
func lookupsVsMap(keys []string, ix indexer.Index, r *result) (float64, floor) {
	// The map owns copies of its keys, filled in object order as an
	// informer's handler would fill it: a query's key never shares memory
	// with the stored one, and the stored keys do not sit in memory in the
	// order of the queries (which would let the map's reads stream).
	m := make(map[string][]string, len(keys))
	for i := range *n {
		for j := range 3 {
			m[model(i, j)] = []string{"app"}
		}
	}
	var mh, mr, mp, ih, ir, ip []float64
	onMap := func() {
		hot, random, parallel, _ := benchLookups(keys, func(k string) int { return len(m[k]) })
		mh, mr, mp = append(mh, hot), append(mr, random), append(mp, parallel)
	}
	onIndex := func() {
		hot, random, parallel, allocs := benchLookups(keys, func(k string) int { return len(ix.Lookup(k)) })
		ih, ir, ip = append(ih, hot), append(ir, random), append(ip, parallel)
		r.lookupAllocs = max(r.lookupAllocs, allocs)
	}
	for round := range lookupRounds {
		// Which goes first alternates too: a drift of the machine's speed
		// within a round favours neither.
		if round%2 == 0 {
			onMap()
			onIndex()
		} else {
			onIndex()
			onMap()
		}
	}
	// The ratios are of each round's pair, whose two runs of a row are
	// about 3 s apart: the machine's speed drifts by more than the
	// difference measured from one round to the next (the map's own rounds
	// span up to 2 × in one run).
	ratios := func(a, b []float64) float64 {
		q := make([]float64, len(a))
		for i := range a {
			q[i] = a[i] / b[i]
		}
		return mid(q)
	}
	r.ratioHot, r.ratioRandom, r.ratioParallel = ratios(ih, mh), ratios(ir, mr), ratios(ip, mp)
	logf("lookups, ns: map hot %v random %v parallel %v; index hot %v random %v parallel %v", mh, mr, mp, ih, ir, ip)
	r.lookupHot, r.lookupRandom, r.lookupParallel = mid(ih), mid(ir), mid(ip)
	return mid(mh), floor{mid(mr), mid(mp)}
}

// lookupRounds is even: the map goes first in half the rounds.
const lookupRounds = 6

// mid is the median of v, which it sorts: the mean of the middle two of
// an even count.
func mid(v []float64) float64 {
	slices.Sort(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}

// lookupRows are the lookup rows of the table: base's (the informer's, or
// nothing) and metasync's times, the map's as the floor, and metasync's
// ratios to the map, each the median of the rounds' pairs.
func lookupRows(base, ms result, floorHot float64, floorRandom floor) []row {
	target := atMost(1.2, "≤ 1.2")
	return []row{
		{name: "lookup, hot key", unit: "ns", baseline: base.lookupHot, metasync: ms.lookupHot},
		{name: "lookup, random keys", unit: "ns", baseline: base.lookupRandom, metasync: ms.lookupRandom},
		{name: "lookup, random, 2 goroutines", unit: "ns", baseline: base.lookupParallel, metasync: ms.lookupParallel},
		{name: "lookup allocs", unit: "allocs", baseline: base.lookupAllocs, metasync: ms.lookupAllocs, target: atMost(0, "0")},
		{name: "plain map, hot key (floor)", unit: "ns", baseline: floorHot, metasync: floorHot, raw: true},
		{name: "plain map, random keys (floor)", unit: "ns", baseline: floorRandom.single, metasync: floorRandom.single, raw: true},
		{name: "plain map, random, 2 goroutines", unit: "ns", baseline: floorRandom.parallel, metasync: floorRandom.parallel, raw: true},
		{name: "lookup / map, hot key (median of 6 rounds' pairs)", unit: "x", metasync: ms.ratioHot, target: target},
		{name: "lookup / map, random keys (median of pairs)", unit: "x", metasync: ms.ratioRandom, target: target},
		{name: "lookup / map, random, 2 goroutines (median of pairs)", unit: "x", metasync: ms.ratioParallel, target: target},
	}
}
