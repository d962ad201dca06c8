//go:build unix

package main

import (
	"math"
	"syscall"
)

// fdLimit is the process's soft limit of open file descriptors
// (RLIMIT_NOFILE), which the Go runtime raised to the hard limit at
// start; 0 when unknown or unlimited.
func fdLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur > math.MaxInt32 {
		return 0
	}
	return int(r.Cur)
}
