package admission

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCaller(t *testing.T) {
	for _, c := range []struct{ identity, remote, want string }{
		{"alice", "10.0.0.1:80", "alice"},
		{"user:bob", "10.0.0.1:80", "user:bob"},
		{"", "10.0.0.1:80", "addr:10.0.0.1"},
		{"", "[::1]:443", "addr:::1"},
		{"", "pipe", "addr:pipe"},
	} {
		if got := Caller(c.identity, c.remote); got != c.want {
			t.Errorf("Caller(%q, %q) = %q, want %q", c.identity, c.remote, got, c.want)
		}
	}
}

func TestTally(t *testing.T) {
	var tl Tally
	if n := tl.Add("a", 2); n != 2 {
		t.Fatalf("Add: %d", n)
	}
	tl.Add("a", -1)
	if tl["a"] != 1 {
		t.Fatalf("a: %d", tl["a"])
	}
	if n := tl.Add("a", -5); n != 0 || len(tl) != 0 {
		t.Fatalf("counted down past 0: %d, %v", n, tl)
	}
}

// TestGate: each bound met is reported, nothing is counted for a
// refusal, and a release given twice gives one place back.
func TestGate(t *testing.T) {
	var g Gate
	r1, full := g.Admit("a", 3, 2)
	if full != 0 {
		t.Fatal(full)
	}
	r2, _ := g.Admit("a", 3, 2)
	if _, full := g.Admit("a", 3, 2); full != PerCaller {
		t.Fatalf("a's third: %v, want PerCaller", full)
	}
	r3, full := g.Admit("b", 3, 2)
	if full != 0 {
		t.Fatal(full)
	}
	if _, full := g.Admit("a", 3, 2); full != PerCaller|Total {
		t.Fatalf("a's third at the total: %v, want both", full)
	}
	if _, full := g.Admit("c", 3, 2); full != Total {
		t.Fatalf("c at the total: %v, want Total", full)
	}
	r1()
	r1()
	if places, callers := g.Open(); places != 2 || callers != 2 {
		t.Fatalf("open %d by %d callers, want 2 by 2", places, callers)
	}
	r2()
	r3()
	if peak, now := g.Peak(); peak != 3 || now != 0 {
		t.Fatalf("peak %d now %d, want 3 0", peak, now)
	}
	if peak, _ := g.Peak(); peak != 0 {
		t.Fatalf("peak after a reading: %d", peak)
	}
	// The caller "" is counted in all only; 0 bounds nothing.
	for range 10 {
		if _, full := g.Admit("", 0, 0); full != 0 {
			t.Fatal(full)
		}
	}
	if places, callers := g.Open(); places != 10 || callers != 0 {
		t.Fatalf("open %d by %d callers, want 10 by 0", places, callers)
	}
}

func TestGateConcurrent(t *testing.T) {
	var g Gate
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if release, full := g.Admit(string(rune('a'+i%2)), 4, 3); full == 0 {
					release()
				}
			}
		}()
	}
	wg.Wait()
	if places, callers := g.Open(); places != 0 || callers != 0 {
		t.Fatalf("left open: %d by %d", places, callers)
	}
}

func TestRefusals(t *testing.T) {
	r := NewRefusals(prometheus.CounterOpts{Name: "test_refused_total", Help: "refusals"}, []string{"x", "y"}, 2, time.Hour)
	if n := testutil.CollectAndCount(r.Metric); n != 2 {
		t.Fatalf("%d series at the start, want 2", n)
	}
	lines := 0
	for range 5 {
		r.Count("x", func() { lines++ })
	}
	if n := testutil.ToFloat64(r.Metric.WithLabelValues("x")); n != 5 {
		t.Errorf("x counted %v, want 5", n)
	}
	if lines != 2 {
		t.Errorf("%d lines logged, want the first 2", lines)
	}
}
