package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/iidp/metasync/test/testenv"
)

// root is the repository's root folder, where `make run` runs devcluster.
var root = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}()

var (
	buildOnce            sync.Once
	buildErr             error
	devclusterBin, msBin string
)

// binaries builds devcluster and metasync once per test binary.
func binaries(t *testing.T) (devcluster, metasync string) {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "devcluster-test-")
		if err != nil {
			buildErr = err
			return
		}
		devclusterBin, msBin = filepath.Join(dir, "devcluster"), filepath.Join(dir, "metasync")
		for bin, pkg := range map[string]string{devclusterBin: "./hack/devcluster", msBin: "./cmd/metasync"} {
			cmd := exec.Command("go", "build", "-o", bin, pkg)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return devclusterBin, msBin
}

func TestMain(m *testing.M) {
	before := goleak.IgnoreCurrent()
	code := m.Run()
	if devclusterBin != "" {
		os.RemoveAll(filepath.Dir(devclusterBin))
	}
	os.Exit(testenv.LeakCheck(code, before))
}

func needControlPlane(t *testing.T) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("no control plane: KUBEBUILDER_ASSETS is not set (run `make test`)")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
}

// devcluster is a running devcluster whose stdout and stderr go, as with
// `make run 2>&1 | tee run.log`, into one pipe that the test reads (and
// may close, as tee does when Ctrl-C kills it).
type devcluster struct {
	cmd  *exec.Cmd
	tmp  string // its TMPDIR: every temporary folder it makes is in there
	pipe *os.File
	out  *testenv.Buffer
	done chan struct{}
	// copied is closed when its output has all been read: once every
	// process that holds the pipe has closed it.
	copied chan struct{}
	kids   []proc // its descendants, as wantChildren found them
}

// startDevcluster starts devcluster from the repository's root with args,
// and stops it (and whatever it started) at the end of the test.
func startDevcluster(t *testing.T, args ...string) *devcluster {
	t.Helper()
	bin, _ := binaries(t)
	d := &devcluster{tmp: t.TempDir(), out: &testenv.Buffer{}, done: make(chan struct{}), copied: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	d.pipe = r
	d.cmd = exec.Command(bin, args...)
	d.cmd.Dir = root
	d.cmd.Env = append(os.Environ(), "TMPDIR="+d.tmp)
	d.cmd.Stdout, d.cmd.Stderr = w, w
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() { _, _ = io.Copy(d.out, r); close(d.copied) }()
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		// Whatever the test did (or the code under test failed to do):
		// nothing it started survives it.
		kids := append(d.kids, descendants(d.cmd.Process.Pid)...)
		_ = d.cmd.Process.Kill()
		<-d.done
		for _, p := range append(kids, using(d.tmp)...) {
			p.kill()
		}
		r.Close()
		if t.Failed() {
			t.Logf("devcluster printed:\n%s", d.out)
		}
	})
	return d
}

// waitFor waits until devcluster printed want, and fails if it exits
// first or takes longer than timeout.
func (d *devcluster) waitFor(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for !strings.Contains(d.out.String(), want) {
		select {
		case <-d.done:
			time.Sleep(100 * time.Millisecond) // the rest of its output
			if strings.Contains(d.out.String(), want) {
				return
			}
			t.Fatalf("devcluster exited (%v) before it printed %q", d.cmd.ProcessState, want)
		case <-deadline:
			t.Fatalf("devcluster did not print %q in %s", want, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// wait waits until devcluster exits, at most timeout.
func (d *devcluster) wait(t *testing.T, timeout time.Duration) *os.ProcessState {
	t.Helper()
	select {
	case <-d.done:
	case <-time.After(timeout):
		t.Fatalf("devcluster still runs %s later", timeout)
		return nil
	}
	// Its last lines may still be in the pipe: read them before the
	// test looks at them (a process it left behind would hold the pipe
	// open, which the test finds by itself).
	select {
	case <-d.copied:
	case <-time.After(5 * time.Second):
	}
	return d.cmd.ProcessState
}

// proc is a process as /proc shows it; start tells it from a later process
// with the same pid.
type proc struct {
	pid   int
	comm  string
	start string
}

// stat reads /proc/PID/stat: command name, state, parent and start time.
func stat(pid int) (comm string, state byte, ppid int, start string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, 0, "", false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, 0, "", false
	}
	f := strings.Fields(s[end+1:]) // state ppid pgrp ... ; starttime is field 22 of the line
	if len(f) < 20 {
		return "", 0, 0, "", false
	}
	ppid, _ = strconv.Atoi(f[1])
	return s[open+1 : end], f[0][0], ppid, f[19], true
}

// alive reports whether p still runs (a zombie has stopped running: its
// parent, init after a reparenting, may not have reaped it yet).
func (p proc) alive() bool {
	_, state, _, start, ok := stat(p.pid)
	return ok && start == p.start && state != 'Z' && state != 'X'
}

func (p proc) kill() {
	if p.alive() {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

func (p proc) String() string { return fmt.Sprintf("%s (pid %d)", p.comm, p.pid) }

// allProcs lists every process's pid.
func allProcs() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// descendants lists the running descendants of pid.
func descendants(pid int) []proc {
	children := map[int][]proc{}
	for _, p := range allProcs() {
		comm, state, ppid, start, ok := stat(p)
		if ok && state != 'Z' {
			children[ppid] = append(children[ppid], proc{p, comm, start})
		}
	}
	var out []proc
	queue := []int{pid}
	for len(queue) > 0 {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
		queue = queue[1:]
	}
	return out
}

// using lists the running processes whose command line names dir.
func using(dir string) []proc {
	var out []proc
	for _, pid := range allProcs() {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte(dir)) {
			continue
		}
		if comm, state, _, start, ok := stat(pid); ok && state != 'Z' {
			out = append(out, proc{pid, comm, start})
		}
	}
	return out
}

// wantChildren checks that the control plane and metasync run under
// devcluster, and returns every descendant.
func wantChildren(t *testing.T, d *devcluster, names ...string) []proc {
	t.Helper()
	kids := descendants(d.cmd.Process.Pid)
	d.kids = append(d.kids, kids...)
	for _, name := range names {
		if !slices.ContainsFunc(kids, func(p proc) bool { return p.comm == name }) {
			t.Fatalf("no %s among devcluster's children: %v", name, kids)
		}
	}
	return kids
}

// wantAllGone waits (at most 15 s) until none of procs runs, nor any process
// whose command line names dir.
func wantAllGone(t *testing.T, procs []proc, dir string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var left []proc
		for _, p := range append(procs, using(dir)...) {
			if p.alive() && !slices.Contains(left, p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still running after devcluster ended: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantEmpty checks that dir holds nothing: every temporary folder is gone.
func wantEmpty(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) > 0 {
		t.Errorf("temporary folders left in %s: %v", dir, names)
	}
}

// TestCtrlCWithOutputPiped is `make run 2>&1 | tee run.log`, then Ctrl-C:
// tee dies first (the test closes the pipe's reading end), then devcluster
// gets SIGINT. It must still stop metasync, kube-apiserver and etcd, remove
// its temporary folders, and exit 0. (On HEAD its next print raised
// SIGPIPE, which killed it and left the three running.) On the way, a
// second devcluster on the same address fails at once, naming it.
func TestCtrlCWithOutputPiped(t *testing.T) {
	needControlPlane(t)
	_, metasync := binaries(t)
	addr := testenv.FreeAddr(t)
	kubeconfig := filepath.Join(t.TempDir(), "dev-kubeconfig")
	d := startDevcluster(t, "--metasync", metasync, "--listen", addr, "--kubeconfig-out", kubeconfig)
	d.waitFor(t, "==> metasync serves on http://"+addr, 2*time.Minute)
	kids := wantChildren(t, d, "kube-apiserver", "etcd", "metasync")
	if out := d.out.String(); !strings.Contains(out, "Live reload: edit ") || !strings.Contains(out, "make apply FILE=") {
		t.Errorf("devcluster does not say how to change data and the config:\n%s", out)
	}

	// `make apply` changes the data without kubectl.
	app := filepath.Join(t.TempDir(), "app.yaml")
	_ = os.WriteFile(app, []byte("apiVersion: iidp.com/v1\nkind: AppModel\nmetadata: {name: mine, namespace: meta-test, labels: {iidp: iidp}}\nspec: {type: model, version: '1', models: [my-model]}\n"), 0o600)
	bin, _ := binaries(t)
	if out, err := exec.Command(bin, "apply", "--kubeconfig", kubeconfig, app).CombinedOutput(); err != nil || !strings.Contains(string(out), "applied "+app) {
		t.Errorf("devcluster apply: %v %s", err, out)
	}
	testenv.Eventually(t, "the applied AppModel served", func() string {
		resp, err := http.Get("http://" + addr + "/v1/indexes/model-to-app/keys/my-model")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), `"values":["mine"]`) {
			return string(body)
		}
		return ""
	})
	if out, err := exec.Command(bin, "apply", "--kubeconfig", filepath.Join(t.TempDir(), "none"), app).CombinedOutput(); err == nil || !strings.Contains(string(out), "is `make run` running?") {
		t.Errorf("devcluster apply without a cluster: %v %s", err, out)
	}

	second := startDevcluster(t, "--metasync", metasync, "--listen", addr)
	ps := second.wait(t, 20*time.Second)
	out := second.out.String()
	if ps.ExitCode() != 1 || !strings.Contains(out, "cannot listen on "+addr) || !strings.Contains(out, "make run LISTEN=") || strings.Contains(out, "starting kube-apiserver") {
		t.Errorf("a second devcluster on %s: %v\n%s", addr, ps, out)
	}

	d.pipe.Close()
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	ps = d.wait(t, time.Minute)
	if ps.ExitCode() != 0 {
		t.Errorf("devcluster ended with %v, want exit 0", ps)
	}
	wantAllGone(t, kids, d.tmp)
	wantEmpty(t, d.tmp)
	if _, err := os.Stat(kubeconfig); !os.IsNotExist(err) {
		t.Errorf("the kubeconfig of a stopped cluster is left: %v", err)
	}
}

// TestKilledDevclusterTakesItsChildren: when devcluster is killed
// (SIGKILL: no cleanup of its own), the kernel still kills metasync,
// kube-apiserver and etcd (parent-death signal). On HEAD all three kept
// running, their ports held.
func TestKilledDevclusterTakesItsChildren(t *testing.T) {
	needControlPlane(t)
	_, metasync := binaries(t)
	d := startDevcluster(t, "--metasync", metasync, "--listen", "127.0.0.1:0")
	d.waitFor(t, "==> metasync serves on", 2*time.Minute)
	kids := wantChildren(t, d, "kube-apiserver", "etcd", "metasync")
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	d.wait(t, 10*time.Second)
	wantAllGone(t, kids, d.tmp)
}

// TestListenInUse: when the address is taken, devcluster fails at once,
// before it starts anything, naming the address and how to pick another.
// (On HEAD it started a control plane, polled the other process's
// /readyz, printed "metasync serves on" with its own kubeconfig, and only
// then failed.)
func TestListenInUse(t *testing.T) {
	bin, _ := binaries(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	cmd := exec.Command(bin, "--listen", addr)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "KUBEBUILDER_ASSETS="+t.TempDir(), "TMPDIR="+t.TempDir())
	start := time.Now()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || time.Since(start) > 10*time.Second {
		t.Fatalf("devcluster --listen %s (taken) = %v after %s\n%s", addr, err, time.Since(start), out)
	}
	for _, want := range []string{"cannot listen on " + addr, "make run LISTEN=127.0.0.1:8081", "--listen"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the message lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "starting kube-apiserver") {
		t.Errorf("started a control plane:\n%s", out)
	}
}

// TestMetasyncExitsBeforeReady: when metasync serve exits before it is
// ready, devcluster fails at once, says so, never says it serves, and
// stops the control plane and removes its folders. (On HEAD it polled for
// 30 s and printed "metasync serves on" all the same.)
func TestMetasyncExitsBeforeReady(t *testing.T) {
	needControlPlane(t)
	fake := filepath.Join(t.TempDir(), "metasync")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'fake metasync: failing' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDevcluster(t, "--metasync", fake, "--listen", "127.0.0.1:0")
	d.waitFor(t, "==> applied", 2*time.Minute)
	d.kids = descendants(d.cmd.Process.Pid)
	kids := d.kids
	ps := d.wait(t, 30*time.Second)
	out := d.out.String()
	if ps.ExitCode() != 1 || !strings.Contains(out, "metasync serve exited before it was ready: exit status 3") || strings.Contains(out, "serves on") {
		t.Errorf("devcluster with a metasync that fails: %v\n%s", ps, out)
	}
	wantAllGone(t, kids, d.tmp)
	wantEmpty(t, d.tmp)
}
