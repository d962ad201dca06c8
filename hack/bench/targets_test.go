package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTargets: a target is checked against the row's own numbers.
func TestTargets(t *testing.T) {
	for _, c := range []struct {
		r      row
		missed bool
	}{
		{row{baseline: 1200, metasync: 90, target: ratioAtMost(1.0/12, "≤ 1/12")}, false},
		{row{baseline: 1200, metasync: 110, target: ratioAtMost(1.0/12, "≤ 1/12")}, true},
		{row{metasync: 0, target: atMost(0, "0")}, false},
		{row{metasync: 1, target: atMost(0, "0")}, true},
		{row{baseline: 1000, metasync: 700, target: ratioAtLeast(0.7, "≥ 70 %")}, false},
		{row{baseline: 1000, metasync: 690, target: ratioAtLeast(0.7, "≥ 70 %")}, true},
		{row{baseline: 1, metasync: 1e9}, false}, // no target
	} {
		if got := c.r.missed(); got != c.missed {
			t.Errorf("%+v: missed %t, want %t", c.r, got, c.missed)
		}
	}
}

// TestBenchstatFormat: each side of each row is one benchmark line.
func TestBenchstatFormat(t *testing.T) {
	report = []row{
		{name: "heap per indexed object", unit: "B", baseline: 1200, metasync: 90, left: "informer", right: "metasync"},
		{name: "relist: peak live heap / steady", unit: "x", metasync: 1.4, raw: true, left: "informer", right: "metasync"},
	}
	defer func() { report = nil }()
	path := filepath.Join(t.TempDir(), "bench.txt")
	if err := writeBenchstat(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	for _, want := range []string{
		"BenchmarkBench/measure=heap_per_indexed_object/side=informer 1 1200 B\n",
		"BenchmarkBench/measure=heap_per_indexed_object/side=metasync 1 90 B\n",
		"BenchmarkBench/measure=relist_peak_live_heap_steady/side=metasync 1 1.4 x\n",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("missing %q in\n%s", want, b)
		}
	}
	if strings.Contains(string(b), "relist_peak_live_heap_steady/side=informer") {
		t.Errorf("a raw row without a baseline has no informer line:\n%s", b)
	}
}
