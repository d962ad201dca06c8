package consul

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// benchKeys is the size of the benchmark's index: the keys (services)
// of service-to-endpoints.
const benchKeys = 60_000

// catalogReads is the engine as the facade reads it, telling the
// benchmark when a read of a whole index (what a watch of the catalog
// makes) has seen a given state.
type catalogReads struct {
	*msync.Inspector
	mu   gosync.Mutex
	cond *gosync.Cond
	seq  uint64 // the newest state a read of a whole index saw
}

func (e *catalogReads) Answers(ts ...msync.Target) []msync.Answer {
	as := e.Inspector.Answers(ts...)
	for i, t := range ts {
		if t.All {
			e.mu.Lock()
			e.seq = max(e.seq, as[i].Seq)
			e.cond.Broadcast()
			e.mu.Unlock()
		}
	}
	return as
}

// waitRead waits until a read of a whole index has seen state seq.
func (e *catalogReads) waitRead(seq uint64) {
	e.mu.Lock()
	for e.seq < seq {
		e.cond.Wait()
	}
	e.mu.Unlock()
}

// benchEngine is an engine of examples/appmodel's config whose index
// service-to-endpoints has benchKeys services (svc-00000...), one
// endpoint each.
func benchEngine(b *testing.B) (*catalogReads, *msync.Feed) {
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		b.Fatal(err)
	}
	objs := make([][]byte, benchKeys)
	for i := range objs {
		objs[i] = slice(fmt.Sprint("s", i), fmt.Sprintf("svc-%05d", i), fmt.Sprintf("10.%d.%d.1", i/250, i%250))
	}
	if err := fake.Feed().Apply("endpointslices", objs...); err != nil {
		b.Fatal(err)
	}
	e := &catalogReads{Inspector: fake.Engine().Inspect()}
	e.cond = gosync.NewCond(&e.mu)
	return e, fake.Feed()
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// quiet waits (up to two minutes) until the process uses less than a
// twentieth of a core over 20 ms: what a write or a query set off has
// run (a watch of the catalog starts by reading the whole index once
// per key of its subscription's first snapshot).
func quiet(b *testing.B) {
	last := cpuTime(b)
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		now := cpuTime(b)
		if now-last < time.Millisecond {
			return
		}
		last = now
	}
}

// BenchmarkCommitWithAbsentNames measures one write to an index of
// benchKeys services with `parked` blocking queries waiting on names that
// are no service (absent-0, absent-1, ...), each from a caller of its
// own, and with none; and, to compare, with one blocking query on
// /v1/catalog/services (catalog=1), which follows every key. A write
// changes either the endpoint of one service (write=values, the usual
// churn) or whether one other service exists (write=keys: it is added,
// then deleted). After each write the
// benchmark waits until every whole-index read that the facade makes of
// it (a watch of the catalog, if there is one) has seen it, so that the
// writes do not fold into each other. ns/op is that wall time;
// cpu-ns/op the process's CPU time per write, the facade's goroutines
// included (measured until they are quiet after the last write).
func BenchmarkCommitWithAbsentNames(b *testing.B) {
	e, f := benchEngine(b)
	var toggles [][]byte // the endpoint of svc-00000... svc-01023, moved and moved back
	for round := range 2 {
		for i := range 1024 {
			toggles = append(toggles, slice(fmt.Sprint("s", i), fmt.Sprintf("svc-%05d", i), fmt.Sprintf("10.%d.%d.%d", i/250, i%250, 2+round)))
		}
	}
	added := slice("bench-new", "bench-new", "10.255.255.1")
	// toggled counts the value writes of every run: each write moves an
	// endpoint to the value it does not have (a run that started its
	// count again could write the value a service already has, a commit
	// that changes no answer and that no read would ever see).
	toggled := 0
	for _, write := range []string{"values", "keys"} {
		for _, queries := range []string{"parked=0", "parked=1000", "catalog=1"} {
			b.Run("write="+write+"/"+queries, func(b *testing.B) {
				s := New(e, []Source{{"indexes", "service-to-endpoints"}}, slog.New(slog.DiscardHandler), nil)
				s.SetLimits(Limits{}) // every query from one test: no bound
				kind, n, _ := strings.Cut(queries, "=")
				parked, _ := strconv.Atoi(n)
				stop := park(b, s, kind == "catalog", parked)
				quiet(b)
				i := 0
				commit := func() {
					var err error
					switch {
					case write == "values":
						err = f.Apply("endpointslices", toggles[toggled%len(toggles)])
						toggled++
					case i%2 == 0:
						err = f.Apply("endpointslices", added)
					default:
						err = f.Delete("endpointslices", "meta-test/bench-new")
					}
					if err != nil {
						b.Fatal(err)
					}
					i++
					s.watches.mu.Lock()
					_, catalog := s.watches.all[watchKey{catalog: true}]
					s.watches.mu.Unlock()
					if catalog {
						e.waitRead(e.Inspector.Answers(msync.Target{})[0].Seq)
					}
				}
				b.ReportAllocs()
				cpu := cpuTime(b)
				b.ResetTimer()
				for b.Loop() {
					commit()
				}
				b.StopTimer()
				quiet(b)
				b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
				if i%2 == 1 && write == "keys" {
					commit() // the next run starts without bench-new
				}
				stop()
				s.Close()
			})
		}
	}
}

// park starts n blocking queries on names that are no service (on the
// catalog's list of services, with catalog), waits until each waits, and
// returns what ends them.
func park(b *testing.B, s *Server, catalog bool, n int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg gosync.WaitGroup
	if n > 0 {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/health/service/absent-0", nil))
		index := rec.Header().Get("X-Consul-Index")
		if _, err := strconv.ParseUint(index, 10, 64); err != nil || rec.Code != http.StatusOK {
			b.Fatalf("a read: %d, index %q", rec.Code, index)
		}
		for i := range n {
			path := fmt.Sprintf("/v1/health/service/absent-%d", i)
			if catalog {
				path = "/v1/catalog/services"
			}
			r := httptest.NewRequestWithContext(ctx, "GET", path+"?index="+index+"&wait=10m", nil)
			r.RemoteAddr = fmt.Sprintf("192.0.%d.%d:1234", i/250, i%250+1)
			wg.Go(func() { s.ServeHTTP(httptest.NewRecorder(), r) })
		}
	}
	for deadline := time.Now().Add(time.Minute); ; {
		waiting := 0
		s.watches.mu.Lock()
		for _, w := range s.watches.all {
			waiting += w.waiters
		}
		s.watches.mu.Unlock()
		if waiting == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d queries waiting, want %d", waiting, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
