package indexer

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"
)

// BenchmarkWriteWhileBusy is the latency of a write to source b, from its
// start until a lookup answers it, while source a of the same store is
// busy:
//
//   - idle: a is not written (the baseline);
//   - claimant: a's one object moves from key to key of a unique index of
//     100,000 objects, 50 times a second (see BenchmarkMovingClaimant);
//   - explain: keys of a's 100,000 objects are explained in a loop (see
//     BenchmarkWriteWhileExplained);
//   - relist: a's 100,000 objects are relisted (Replace) in a loop, each
//     relist changing every object;
//   - hinted: a's key of 10,000 endpoints, hinted for 3 zones, is
//     written in a loop (one endpoint changes each time), which computes
//     the key's preferred answers again; hinted-apart, the same in a
//     source of another store (the control, as relist-apart is);
//   - relist-apart: the same relist, of a source of another store: what
//     b loses to the relist's use of the processors and of the collector
//     alone, with no lock in common.
//
// b's writes are paced, one a millisecond, and each is timed from when it
// was due: a write that waits for a's work counts the writes due
// meanwhile as waiting too, as clients sending at that rate would see.
// (A sleep of the pacing that ends late moves the writes due after it by
// as much: the timer's slack is no write's.) It reports the median (p50-ns), the 99th percentile (p99-ns)
// and the longest (max-ns); ns/op is the pacing's interval, or more when
// b falls behind it.
func BenchmarkWriteWhileBusy(b *testing.B) {
	const n = 100_000
	for _, busy := range []string{"idle", "claimant", "explain", "relist", "hinted", "hinted-apart", "relist-apart"} {
		b.Run("a="+busy, func(b *testing.B) {
			specA := SourceSpec{Name: "a", Indexes: []string{"a"}, Unique: []string{"a"}}
			if busy == "hinted" || busy == "hinted-apart" {
				specA.Indexes = append(specA.Indexes, "eps", "eps/hints")
				specA.Hints = map[string]string{"eps": "eps/hints"}
			}
			s, err := New(specA, SourceSpec{Name: "b", Indexes: []string{"b"}})
			if err != nil {
				b.Fatal(err)
			}
			a := s.Source("a")
			a.Replace(appModelObjects(n, "metasync-bench/", true))
			ixA, _ := s.Index("a")
			ixB, _ := s.Index("b")
			stop, done := make(chan struct{}), make(chan struct{})
			stopped := func() bool {
				select {
				case <-stop:
					return true
				default:
					return false
				}
			}
			var work func(i int)
			switch busy {
			case "claimant":
				meta := Meta{Version: "1", Created: 1764000001}
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				work = func(i int) {
					select {
					case <-tick.C:
					case <-stop:
						return
					}
					tx := a.Begin()
					tx.Put(Object{Key: "metasync-bench/mover", Meta: meta, Entries: [][]Entry{{{Key: fmt.Sprintf("model-%06d-%d", i%n, i%3), Value: "mover"}}}})
					tx.Commit()
				}
			case "explain":
				keys := s.Snapshot().Keys(ixA)
				work = func(i int) {
					s.Explain(func(x *Explainer) { x.Claims(ixA, keys[i%len(keys):i%len(keys)+1]) })
				}
			case "hinted", "hinted-apart":
				const endpoints = 10_000
				written := a
				if busy == "hinted-apart" {
					apart, err := New(specA)
					if err != nil {
						b.Fatal(err)
					}
					written = apart.Source("a")
				}
				work = func(i int) {
					eps, hints := make([]Entry, endpoints), make([]Entry, endpoints)
					for j := range eps {
						v := fmt.Sprintf("10.%d.%d.%d", j/65536, j/256%256, j%256)
						if j == 0 {
							v = "10.255.0." + strconv.Itoa(i%256)
						}
						eps[j] = Entry{Key: "svc", Value: v}
						hints[j] = Entry{Key: "svc", Value: v + "\tzone=zone-" + strconv.Itoa(j%3)}
					}
					tx := written.Begin()
					tx.Put(Object{Key: "metasync-bench/slice", Entries: [][]Entry{nil, eps, hints}})
					tx.Commit()
				}
			case "relist", "relist-apart":
				relisted := a
				if busy == "relist-apart" {
					apart, err := New(SourceSpec{Name: "a", Indexes: []string{"a"}, Unique: []string{"a"}})
					if err != nil {
						b.Fatal(err)
					}
					relisted = apart.Source("a")
					relisted.Replace(appModelObjects(n, "metasync-bench/", true))
				}
				lists := [2][]Object{appModelObjects(n, "metasync-bench/", true), appModelObjects(n, "metasync-bench/", true)}
				for j := range lists[1] {
					lists[1][j].Meta.Version += "-2"
					for k := range lists[1][j].Entries[0] {
						lists[1][j].Entries[0][k].Value += "-2"
					}
				}
				work = func(i int) { relisted.Replace(lists[(i+1)%2]) }
			}
			runtime.GC() // the setup's garbage
			go func() {
				defer close(done)
				for i := 0; work != nil && !stopped(); i++ {
					work(i)
				}
			}()
			if busy != "idle" {
				time.Sleep(100 * time.Millisecond) // a's work under way
			}
			lat := pacedWrites(b, s.Source("b"), ixB)
			close(stop)
			<-done
			reportLatencies(b, lat)
		})
	}
}

// pacedWrites writes to src, one write a millisecond for as long as b
// loops, and returns the latency of each, from when it was due until ixB
// answers it, with b's timer stopped before it returns.
func pacedWrites(b *testing.B, src *Source, ixB Index) []time.Duration {
	const every = time.Millisecond
	lat := make([]time.Duration, 0, 4096)
	b.ReportAllocs()
	b.ResetTimer()
	base := time.Now()
	for i := 0; b.Loop(); i++ {
		from := base.Add(time.Duration(i) * every)
		if wait := time.Until(from); wait > 0 {
			time.Sleep(wait)
			// The timer's slack is no write's: the writes due
			// after this one move by as much.
			now := time.Now()
			base = base.Add(now.Sub(from))
			from = now
		}
		v := strconv.Itoa(i)
		tx := src.Begin()
		tx.Put(Object{Key: "ns/b", Entries: [][]Entry{{{Key: "k", Value: v}}}})
		tx.Commit()
		for got := ixB.Lookup("k"); len(got) != 1 || got[0] != v; got = ixB.Lookup("k") {
		}
		lat = append(lat, time.Since(from))
	}
	b.StopTimer()
	return lat
}

// reportLatencies reports the median, the 99th percentile and the longest
// of lat.
func reportLatencies(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) }
	b.ReportMetric(at(0.50), "p50-ns")
	b.ReportMetric(at(0.99), "p99-ns")
	b.ReportMetric(float64(lat[len(lat)-1]), "max-ns")
}
