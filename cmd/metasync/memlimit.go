package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// memoryLimitShare is the part of the container's memory limit given to
// the Go runtime as its soft limit: the rest is for what the runtime does
// not count (the binary's pages, C libraries none, the kernel's buffers).
const memoryLimitShare = 0.9

// setMemoryLimit applies --memory-limit: "auto" sets the Go runtime's soft
// memory limit to 90 % of the container's cgroup memory limit (v2, else
// v1) when there is one and GOMEMLIMIT is not set; "off" leaves the
// runtime alone; a quantity ("400Mi", "0.5Gi", "1G", bytes; see
// parseMemoryLimit) sets that. It returns
// what it did, for the log. cgroupRoot is /sys/fs/cgroup but in tests.
func setMemoryLimit(flag, cgroupRoot string, log *slog.Logger) error {
	switch flag {
	case "off":
		return nil
	case "auto", "":
		if v := os.Getenv("GOMEMLIMIT"); v != "" {
			log.Info("memory limit from GOMEMLIMIT", "GOMEMLIMIT", v)
			return nil
		}
		limit, source := cgroupMemoryLimit(cgroupRoot)
		if limit <= 0 {
			log.Debug("no container memory limit: the Go runtime's memory limit is left unset")
			return nil
		}
		soft := int64(float64(limit) * memoryLimitShare)
		if soft < minMemoryLimit {
			log.Warn("container memory limit too small to give the Go runtime: left unset", "limit", limit, "from", source)
			return nil
		}
		debug.SetMemoryLimit(soft)
		log.Info("memory limit set from the container's", "limit", limit, "goMemoryLimit", soft, "from", source)
		return nil
	}
	v, err := parseMemoryLimit(flag)
	if err != nil {
		return fmt.Errorf("--memory-limit %q: %v: want auto, off, or a quantity of at least 16Mi such as 400Mi or 0.5Gi", flag, err)
	}
	debug.SetMemoryLimit(v)
	log.Info("memory limit set", "goMemoryLimit", v)
	return nil
}

// parseMemoryLimit reads a memory limit given as a Kubernetes quantity,
// as a container's resources.limits.memory is written ("400Mi", "0.5Gi",
// "1G", "1.5e9", bytes): a whole number of bytes, at least minMemoryLimit,
// that fits an int64. resource.Quantity keeps "0.5Gi" as a decimal that
// AsInt64 does not convert, so the value is read exactly from its decimal
// form; "400m" (0.4 bytes) and "0.1Gi" (107374182.4 bytes) are refused,
// not rounded.
func parseMemoryLimit(s string) (int64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, errors.New("not a quantity")
	}
	d := q.AsDec()
	n := new(big.Int).Set(d.UnscaledBig())
	switch scale := int64(d.Scale()); {
	case n.Sign() <= 0:
		return 0, errors.New("not a positive quantity")
	case scale < -18:
		return 0, errors.New("too large")
	case scale < 0:
		n.Mul(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(-scale), nil))
	case scale > 0:
		if scale > 40 {
			return 0, errors.New("a fraction of a byte")
		}
		var rem big.Int
		n.QuoRem(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(scale), nil), &rem)
		if rem.Sign() != 0 {
			return 0, errors.New("a fraction of a byte")
		}
	}
	if !n.IsInt64() {
		return 0, errors.New("too large")
	}
	if v := n.Int64(); v >= minMemoryLimit {
		return v, nil
	}
	return 0, errors.New("under 16Mi")
}

// minMemoryLimit is the smallest memory limit worth giving the runtime:
// under it the collector would run all the time.
const minMemoryLimit = 16 << 20

// cgroupMemoryLimit returns the memory limit of the process's cgroup and
// the file it came from; 0 when there is none ("max", or a v1 limit of
// about 2^63, unlimited).
func cgroupMemoryLimit(root string) (int64, string) {
	// v2: the limit of the process's own cgroup (the container's, in a
	// pod: /sys/fs/cgroup is its namespace's root), else of the root.
	paths := []string{}
	if rel := cgroupV2Path(); rel != "" {
		paths = append(paths, filepath.Join(root, rel, "memory.max"))
	}
	paths = append(paths, filepath.Join(root, "memory.max"), filepath.Join(root, "memory", "memory.limit_in_bytes"))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, p
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= math.MaxInt64/2 {
			return 0, p // v1's "unlimited" is a page-rounded 2^63
		}
		return n, p
	}
	return 0, ""
}

// cgroupV2Path returns the process's cgroup v2 path ("/..." from
// /proc/self/cgroup's "0::" line), or "".
func cgroupV2Path() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok && rest != "/" {
			return rest
		}
	}
	return ""
}

// trimEvery is how often returnFreeMemory looks at the heap; below
// trimFloor of free or dead memory it leaves the heap alone (a
// collection of a heap that small takes well under a millisecond, but
// there is nothing worth returning).
const (
	trimEvery = 5 * time.Second
	trimFloor = 1 << 20
)

// compactor is what returnFreeMemory needs of the engine.
type compactor interface {
	Compact() bool
	Writes() uint64
}

// returnFreeMemory gives free heap back to the kernel when it has piled
// up. Every trimEvery:
//
//   - when the heap's free memory not yet returned, or its dead objects not
//     yet collected, come to more than a quarter of the live heap (and
//     trimFloor), it calls debug.FreeOSMemory (a collection, then every
//     free page returned). After churn the runtime would otherwise keep up
//     to its heap goal, twice the live heap, resident: garbage waits for
//     the next collection, which an idle process does not reach for
//     minutes, and free pages for the scavenger.
//   - then, when the engine has not written since the last look, it asks
//     the engine to compact (which moves the index tables into fresh
//     memory, once enough was written since the last time) and, if it
//     did, returns free memory again: after churn the current index pages
//     lie scattered among spans that their old copies filled, and each
//     keeps its span resident. Not while writes go on: the pages written
//     after a compaction leave its arrays partly stale.
//
// It returns when ctx ends.
func returnFreeMemory(ctx context.Context, log *slog.Logger, e compactor) {
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/free:bytes"},    // free, not returned
		{Name: "/memory/classes/heap/objects:bytes"}, // live and dead objects
		{Name: "/memory/classes/heap/unused:bytes"},  // room in spans in use
		{Name: "/gc/heap/live:bytes"},                // live at the last collection
	}
	read := func() (free, dead, unused, live uint64) {
		metrics.Read(samples)
		free, objects, unused, live := samples[0].Value.Uint64(), samples[1].Value.Uint64(), samples[2].Value.Uint64(), samples[3].Value.Uint64()
		if objects > live {
			dead = objects - live
		}
		return free, dead, unused, live
	}
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	writes := e.Writes()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		free, dead, unused, live := read()
		if piled := max(free, dead); piled > trimFloor && piled > live/4 {
			start := time.Now()
			debug.FreeOSMemory()
			log.Debug("free heap returned to the kernel", "free", free, "dead", dead, "live", live, "took", time.Since(start).String())
			_, _, unused, live = read()
		}
		w := e.Writes()
		quiet := w == writes
		writes = w
		if quiet {
			start := time.Now()
			if e.Compact() {
				debug.FreeOSMemory()
				_, _, after, liveAfter := read()
				log.Debug("index tables compacted", "unused", unused, "unusedAfter", after, "live", live, "liveAfter", liveAfter, "took", time.Since(start).String())
			}
		}
	}
}
