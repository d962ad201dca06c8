//go:build !linux

package main

import (
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// envPrefix starts the names of devcluster's own variables (none outside
// Linux).
const envPrefix = "DEVCLUSTER_BACKSTOP_"

// backstop does nothing outside Linux: there is no parent-death signal.
// The control plane stops when devcluster stops (Ctrl-C, SIGTERM, SIGHUP),
// not when it is killed.
func backstop(*envtest.Environment, string) error { return nil }

// backstopMain does nothing outside Linux.
func backstopMain() {}

// childAttr is the process attributes of metasync serve: its own process
// group.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
