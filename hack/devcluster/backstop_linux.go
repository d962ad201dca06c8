package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// envPrefix starts the names of the variables by which devcluster tells
// a backstop what to run; children other than the control plane's do not
// get them.
const envPrefix = "DEVCLUSTER_BACKSTOP_"

// The control plane's binaries: envtest starts each one itself, in a
// process group of its own, and offers no hook to set process attributes.
// So envtest is given, in their place, links named after them to
// devcluster's own executable; started under such a name, devcluster
// (backstopMain) sets its parent-death signal to SIGKILL and execs the
// real binary, which keeps the signal: when devcluster dies, even by
// SIGKILL, the kernel kills kube-apiserver and etcd.
var controlPlaneBinaries = []string{"kube-apiserver", "etcd"}

// backstop points env at the links for the control plane's binaries,
// made in dir.
func backstop(env *envtest.Environment, dir string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("backstop: %w", err)
	}
	links := filepath.Join(dir, "backstop")
	if err := os.Mkdir(links, 0o700); err != nil {
		return err
	}
	paths := map[string]string{}
	for _, name := range controlPlaneBinaries {
		link := filepath.Join(links, name)
		if err := os.Symlink(self, link); err != nil {
			return fmt.Errorf("backstop: %w", err)
		}
		paths[name] = link
		if err := os.Setenv(envName(name), realBinary(name)); err != nil {
			return err
		}
	}
	if err := os.Setenv(envPrefix+"PARENT", strconv.Itoa(os.Getpid())); err != nil {
		return err
	}
	env.ControlPlane.GetAPIServer().Path = paths["kube-apiserver"]
	if env.ControlPlane.Etcd == nil {
		env.ControlPlane.Etcd = &envtest.Etcd{}
	}
	env.ControlPlane.Etcd.Path = paths["etcd"]
	return nil
}

// realBinary finds a control-plane binary as envtest would:
// TEST_ASSET_KUBE_APISERVER (or TEST_ASSET_ETCD), else KUBEBUILDER_ASSETS.
func realBinary(name string) string {
	if p, ok := os.LookupEnv("TEST_ASSET_" + upperSnake(name)); ok {
		return p
	}
	return filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), name)
}

func envName(name string) string { return envPrefix + upperSnake(name) }

func upperSnake(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z':
			b[i] = c - 'a' + 'A'
		case c == '-':
			b[i] = '_'
		}
	}
	return string(b)
}

// backstopMain returns at once, unless this process was started through a
// link of backstop: then it sets the parent-death signal and becomes the
// real binary, or exits.
func backstopMain() {
	name := filepath.Base(os.Args[0])
	real, parent := os.Getenv(envName(name)), os.Getenv(envPrefix+"PARENT")
	if real == "" || parent == "" {
		return
	}
	// The signal is a thread's attribute, kept across execve by the thread
	// that calls it: the same thread must set it and exec.
	runtime.LockOSThread()
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0); errno != 0 {
		fmt.Fprintf(os.Stderr, "devcluster backstop for %s: prctl: %v\n", name, errno)
		os.Exit(1)
	}
	if strconv.Itoa(os.Getppid()) != parent {
		os.Exit(1) // devcluster died before the signal was set
	}
	err := syscall.Exec(real, append([]string{real}, os.Args[1:]...), childEnv())
	fmt.Fprintf(os.Stderr, "devcluster backstop: exec %s: %v\n", real, err)
	os.Exit(127)
}

// childAttr is the process attributes of metasync serve: its own process
// group, and SIGKILL when devcluster dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
