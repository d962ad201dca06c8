package main

import (
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
)

// target is what a row must meet: its text, as the table prints it, and
// the check that -check applies. The zero target is none.
type target struct {
	text string
	met  func(r row) bool
}

// atMost: metasync's measure is at most limit.
func atMost(limit float64, text string) target {
	return target{text, func(r row) bool { return r.metasync <= limit }}
}

// ratioAtMost: metasync's measure is at most x times the baseline.
func ratioAtMost(x float64, text string) target {
	return target{text, func(r row) bool { return r.metasync <= x*r.baseline }}
}

// ratioAtLeast: metasync's measure is at least x times the baseline.
func ratioAtLeast(x float64, text string) target {
	return target{text, func(r row) bool { return r.metasync >= x*r.baseline }}
}

// missed reports whether the row has a target and misses it.
func (r row) missed() bool { return r.target.met != nil && !r.target.met(r) }

// report collects every row that the tables print, for -check and
// -benchstat.
var report []row

// check prints the rows that miss their targets; with -check, it makes the
// bench exit with status 1 when any does.
func check() error {
	var missed []string
	checked := 0
	for _, r := range report {
		if r.target.met == nil {
			continue
		}
		checked++
		if r.missed() {
			missed = append(missed, fmt.Sprintf("  %s: %s against %s, target %s", r.name, format(r.metasync, r.unit), format(r.baseline, r.unit), r.target.text))
		}
	}
	fmt.Printf("\ntargets: %d checked, %d missed\n", checked, len(missed))
	for _, m := range missed {
		fmt.Println(m)
	}
	if *checkTargets && len(missed) > 0 {
		return fmt.Errorf("%d of %d targets missed", len(missed), checked)
	}
	return nil
}

var nonName = regexp.MustCompile(`[^A-Za-z0-9]+`)

// writeBenchstat writes every row in the Go benchmark format, one line per
// side, so that benchstat compares two runs (two refs, two machines):
//
//	BenchmarkBench/measure=heap_per_indexed_object/side=metasync 1 83.2 B
func writeBenchstat(path string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "goos: %s\ngoarch: %s\npkg: github.com/iidp/metasync/hack/bench\n", runtime.GOOS, runtime.GOARCH)
	for _, r := range report {
		name := strings.Trim(nonName.ReplaceAllString(r.name, "_"), "_")
		unit := nonName.ReplaceAllString(r.unit, "_")
		if unit == "" || unit == "_" {
			unit = "count"
		}
		if r.baseline != 0 {
			fmt.Fprintf(&b, "BenchmarkBench/measure=%s/side=%s 1 %g %s\n", name, r.left, r.baseline, unit)
		}
		fmt.Fprintf(&b, "BenchmarkBench/measure=%s/side=%s 1 %g %s\n", name, r.right, r.metasync, unit)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
