// Small helpers used by several files of the bench.

package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"time"
)

// logf writes a timestamped progress line to stderr; the table goes to
// stdout.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// median returns the median of ds, leaving ds in its order.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// heap returns the bytes of heap in use after two garbage collections,
// with the freed memory returned to the OS: the live heap, for the
// before/after differences of the bytes-per-object measures.
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// quiet is a logger that discards everything: for the engines and the API
// server when -v is off, and wherever the bench wants no log lines.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
