// Command devcluster runs metasync on a local control plane, for `make run`:
// it starts kube-apiserver and etcd (the pinned binaries that the tests
// use), installs examples/appmodel's CRD, samples and routing, runs
// `metasync serve` with examples/appmodel/config.yaml, waits until it is
// ready, and prints commands to try. Ctrl-C (SIGINT), SIGTERM or SIGHUP
// stops everything and removes the temporary folders.
//
// Stopping never depends on stdout: with `make run | tee run.log`, Ctrl-C
// ends tee first, and devcluster (which handles SIGPIPE, and prints through
// writers that drop what they cannot write) still stops its children.
// metasync's output goes through devcluster, so that metasync never writes
// to a closed pipe either. And the children never outlive devcluster, even
// when it is killed: on Linux each one has a parent-death signal, SIGKILL
// (see backstop_linux.go).
//
// Before it starts anything, devcluster checks that the address of
// metasync serve (--listen, `make run LISTEN=...`) is free; port 0 picks a
// free one.
//
// While it runs, the control plane's kubeconfig is also at
// --kubeconfig-out (bin/dev-kubeconfig), removed at the stop, and
// `devcluster apply FILE...` (`make apply FILE=...`) applies YAML to that
// cluster with server-side apply: no kubectl is needed to change data.
//
// With --clusters 2 (`make run CLUSTERS=2`) it also starts a second
// control plane, west, and serves examples/clusters/config.yaml: east is
// the first, west is read through a client certificate of the
// ServiceAccount of examples/clusters/remote-reader.yaml. West's
// kubeconfig is at --kubeconfig-out with -west added (`make apply
// CLUSTER=west`), and `devcluster apiserver stop|start CLUSTER` (`make
// stop-apiserver`, `make start-apiserver`), through the Unix socket of
// --control, stops a cluster's kube-apiserver and starts it again (see
// clusters.go).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/iidp/metasync/internal/kubeapply"
)

func main() {
	backstopMain() // returns unless this process is a control-plane child's backstop
	stdout, stderr := &dropWriter{w: os.Stdout}, &dropWriter{w: os.Stderr}
	if err := run(os.Args[1:], stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "devcluster:", err)
		os.Exit(1)
	}
}

// dropWriter writes to w until a write fails (a closed pipe: tee is gone),
// then drops everything. It never fails, so that no print can cut a stop
// short, and a child whose output it relays never blocks nor gets EPIPE.
type dropWriter struct {
	mu     sync.Mutex
	w      io.Writer
	broken bool
}

func (d *dropWriter) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.broken {
		if _, err := d.w.Write(p); err != nil {
			d.broken = true
		}
	}
	return len(p), nil
}

// Durations of the stop and of the wait for metasync's readiness.
const (
	defaultReadyTimeout = 60 * time.Second
	metasyncStopAfter   = 20 * time.Second
	controlPlaneStop    = 15 * time.Second
)

// defaultKubeconfigOut is where a running devcluster leaves its
// kubeconfig for `devcluster apply` and kubectl.
const defaultKubeconfigOut = "bin/dev-kubeconfig"

// options are devcluster's flags.
type options struct {
	bin, config, configCopy, listen, xdsListen, bootstrapOut, kubeconfigOut, control string
	readyTimeout                                                                     time.Duration
	withServers                                                                      bool
	clusters                                                                         int
}

// parseFlags reads devcluster's flags; nil options for -help.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("devcluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bin, "metasync", "bin/metasync", "the metasync binary")
	fs.StringVar(&o.config, "config", "", "config for metasync serve (edit it while it runs: metasync reloads it); default: a copy of "+exampleConfig+" (with --clusters 2: of "+clustersConfig+") at --config-copy")
	fs.StringVar(&o.configCopy, "config-copy", "", "where the copy of the example's config goes when --config is not given (make run: bin/run-config.yaml); default: a temporary folder")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address of metasync serve; port 0 picks a free one")
	fs.StringVar(&o.xdsListen, "xds-listen", "", "also serve xDS here (metasync serve --xds-listen; make run: 127.0.0.1:18000); port 0 picks a free one; empty: no xDS")
	fs.StringVar(&o.bootstrapOut, "bootstrap-out", "", "with --xds-listen, write an xDS client's bootstrap here (make run: bin/xds-bootstrap.json); default: a temporary folder")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", defaultReadyTimeout, "how long to wait for metasync serve to be ready before printing the commands to try all the same")
	fs.BoolVar(&o.withServers, "backends", true, "put gRPC health servers on this host's address behind the example's Services, in place of the made-up addresses of "+routingFile)
	fs.StringVar(&o.kubeconfigOut, "kubeconfig-out", "", "also write the control plane's kubeconfig here while it runs (for `devcluster apply` and kubectl; make run writes "+defaultKubeconfigOut+"); with --clusters 2, west's beside it, with -west added to its name")
	fs.IntVar(&o.clusters, "clusters", 1, "1: one control plane; 2: a second one, west, and metasync serves both (a copy of "+clustersConfig+")")
	fs.StringVar(&o.control, "control", "", "listen here (a Unix socket) for `devcluster apiserver stop|start CLUSTER`, which stops and starts a cluster's kube-apiserver (make run: "+defaultControl+")")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil
		}
		return nil, err
	}
	if o.clusters != 1 && o.clusters != 2 {
		return nil, fmt.Errorf("--clusters %d: 1 or 2", o.clusters)
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "apply" {
		return apply(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "apiserver" {
		return apiserverCmd(args[1:], stdout, stderr)
	}
	o, err := parseFlags(args, stderr)
	if o == nil {
		return err
	}
	say := func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) }
	ctx, cancel, again := onSignals(say)
	defer cancel()

	addr, err := freeListen(o.listen)
	if err != nil {
		return err
	}
	xdsAddr := ""
	if o.xdsListen != "" {
		if xdsAddr, err = freeListenXDS(o.xdsListen); err != nil {
			return err
		}
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set: use `make run`")
	}
	dir, err := os.MkdirTemp("", "metasync-run-")
	if err != nil {
		return err
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(stderr, "devcluster: remove", dir+":", err)
		}
	}()

	planes, err := startPlanes(ctx, dir, o, say, stderr)
	defer planes.stop(say, stderr)
	if err != nil || ctx.Err() != nil {
		return err
	}
	east := planes.list[0]
	servers, err := applyEast(ctx, east, o.withServers, say)
	if servers != nil {
		defer servers.stop()
	}
	if err != nil || ctx.Err() != nil {
		return err
	}
	if o.control != "" {
		closeControl, err := serveControl(o.control, planes, say)
		if err != nil {
			return err
		}
		defer closeControl()
	}
	// The config: a copy that make run owns, unless one was given.
	if o.config == "" {
		path := o.configCopy
		if path == "" {
			path = filepath.Join(dir, "config.yaml")
		}
		if err := planes.copyConfig(path); err != nil {
			return err
		}
		o.config = path
	}
	bootstrap := ""
	if xdsAddr != "" {
		bootstrap = o.bootstrapOut
		if bootstrap == "" {
			bootstrap = filepath.Join(dir, "xds-bootstrap.json")
		}
		if err := writeBootstrap(bootstrap, xdsAddr); err != nil {
			return err
		}
		if o.bootstrapOut != "" {
			defer os.Remove(bootstrap)
		}
	}
	return serve(ctx, again, o, served{addr: addr, xds: xdsAddr, bootstrap: bootstrap, kubeconfig: east.kubeconfig, backends: servers != nil, planes: planes}, say, stdout, stderr)
}

// onSignals cancels ctx at the first SIGINT, SIGTERM or SIGHUP, and
// closes again at the second (hurry).
func onSignals(say func(string, ...any)) (ctx context.Context, cancel context.CancelFunc, again chan struct{}) {
	// Writes to a closed stdout or stderr fail with EPIPE instead of
	// killing the process: the stop below must run whatever happened to
	// the terminal or the pipe. (Notify, not Ignore: an ignored signal
	// would stay ignored in the children.)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	ctx, cancel = context.WithCancel(context.Background())
	again = make(chan struct{})
	go func() {
		sig := <-sigs
		say("\n==> %s: stopping", sig)
		cancel()
		<-sigs
		close(again)
		for range sigs { // keep them from killing the stop
		}
	}()
	return ctx, cancel, again
}

// applyEast applies the example's samples and routing to the first
// control plane, with gRPC servers on this host's address behind the
// Services when it has one; the servers are nil without.
func applyEast(ctx context.Context, east *plane, withServers bool, say func(string, ...any)) (*backends, error) {
	files := []string{"examples/appmodel/samples.yaml", routingFile}
	objs, err := kubeapply.Objects(files[0])
	if err != nil {
		return nil, err
	}
	var servers *backends
	if withServers {
		ip, err := hostIPv4()
		if err != nil {
			say("==> no gRPC backends: %v; the Services keep the made-up addresses of %s, which answer no call", err, routingFile)
		} else {
			routed, b, err := withBackends(ip, routingFile)
			if err != nil {
				return nil, err
			}
			servers = b
			objs = append(objs, routed...)
		}
	}
	if servers == nil {
		routed, err := kubeapply.Objects(routingFile)
		if err != nil {
			return nil, err
		}
		objs = append(objs, routed...)
	}
	applyCtx, applied := context.WithTimeout(ctx, 60*time.Second)
	err = kubeapply.Apply(applyCtx, east.cfg, objs...)
	applied()
	if ctx.Err() != nil || err != nil {
		return servers, err
	}
	to := ""
	if east.several {
		to = " to east"
	}
	say("==> applied %v%s", files, to)
	if servers != nil {
		var lines []string
		for _, slice := range slices.Sorted(maps.Keys(servers.addrs)) {
			lines = append(lines, fmt.Sprintf("    EndpointSlice %s -> %s", slice, servers.addrs[slice]))
		}
		say("==> gRPC health servers on this host's address behind the Services of %s (in place of its made-up addresses):\n%s", routingFile, strings.Join(lines, "\n"))
	}
	return servers, nil
}

// served is what serve runs metasync with, and what its Try block names.
type served struct {
	addr, xds, bootstrap, kubeconfig string
	backends                         bool
	planes                           *planes
}

// serve runs metasync serve until ctx ends or it exits, and prints the
// commands to try once it is ready (or has waited long enough).
func serve(ctx context.Context, again chan struct{}, o *options, s served, say func(string, ...any), stdout, stderr io.Writer) error {
	// Still free? Another run may have taken it while the control plane
	// started.
	addr, err := freeListen(s.addr)
	if err != nil {
		return err
	}
	serveArgs := []string{"serve", "--config", o.config, "--kubeconfig", s.kubeconfig, "--listen", addr}
	if s.xds != "" {
		if _, err := freeListenXDS(s.xds); err != nil {
			return err
		}
		serveArgs = append(serveArgs, "--xds-listen", s.xds)
	}
	cmd := exec.Command(o.bin, serveArgs...)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// Its own process group: a terminal's Ctrl-C reaches devcluster, which
	// stops metasync first, then the control plane. Pdeathsig (Linux): it
	// dies with devcluster, whatever kills devcluster.
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", o.bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer stopMetasync(cmd, exited, again, say)

	url := "http://" + addr
	switch err := waitReady(ctx, url, exited, o.readyTimeout); {
	case errors.Is(err, errExited):
		return err
	case ctx.Err() != nil:
		return nil
	case err != nil:
		say("\n==> metasync serve is not ready after %s: %v\n    It keeps running, and answers what it has synced; see its logs above, and: curl -s '%s/readyz?verbose'",
			o.readyTimeout, err, url)
		fallthrough
	default:
		info := tryInfo{url: url, bin: o.bin, kubeconfig: s.kubeconfig, config: o.config, xds: s.xds, bootstrap: s.bootstrap, backends: s.backends}
		if len(s.planes.list) > 1 {
			say("%s", tryClusters(info, s.planes.list[1]))
		} else {
			say("%s", tryBlock(info))
		}
	}

	select {
	case err := <-exited:
		exited <- err // for stopMetasync
		return fmt.Errorf("metasync serve exited: %v", err)
	case <-ctx.Done():
		return nil
	}
}

// freeListen checks that addr is free to listen on, and returns it; port 0
// picks a free port.
func freeListen(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		host, _, _ := net.SplitHostPort(addr)
		if host == "" {
			host = "127.0.0.1"
		}
		return "", fmt.Errorf("metasync serve cannot listen on %s: %v\n"+
			"  Is another `make run` (or metasync serve) running? Stop it, or pick another address:\n"+
			"    make run LISTEN=%s:8081       (or LISTEN=%s:0 for any free port; devcluster --listen ADDR)",
			addr, err, host, host)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// errExited: metasync serve ended before it was ready.
var errExited = errors.New("metasync serve exited before it was ready")

// waitReady polls url's /readyz until it answers 200, for timeout. It
// fails at once when metasync exits (its answer would come from another
// process: the address was free when metasync started).
func waitReady(ctx context.Context, url string, exited chan error, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.After(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := errors.New("no answer")
	for {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("%w: %v", errExited, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return last
		case <-tick.C:
		}
		resp, err := client.Get(url + "/readyz?verbose")
		if err != nil {
			last = err
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("/readyz: %s %s", resp.Status, strings.TrimSpace(string(body)))
			var why struct{ Reasons []string }
			if json.Unmarshal(body, &why) == nil && len(why.Reasons) > 0 {
				last = fmt.Errorf("not ready: %s", strings.Join(why.Reasons, "; "))
			}
			continue
		}
		select { // ready, and still ours
		case err := <-exited:
			exited <- err
			return fmt.Errorf("%w: %v", errExited, err)
		default:
			return nil
		}
	}
}

// stopMetasync stops metasync serve: SIGTERM, then SIGKILL after
// metasyncStopAfter or at a second signal.
func stopMetasync(cmd *exec.Cmd, exited chan error, again chan struct{}, say func(string, ...any)) {
	select {
	case <-exited:
		return
	default:
	}
	say("==> stopping metasync serve")
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-again:
		_ = cmd.Process.Kill()
		<-exited
	case <-time.After(metasyncStopAfter):
		say("==> metasync serve did not stop in %s: killing it", metasyncStopAfter)
		_ = cmd.Process.Kill()
		<-exited
	}
}

// childEnv is devcluster's environment without its own variables.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			env = append(env, kv)
		}
	}
	return env
}

// apply applies YAML files to the cluster of a running devcluster (its
// --kubeconfig-out), as `make apply FILE=...` asks.
func apply(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("devcluster apply", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", defaultKubeconfigOut, "the kubeconfig of the cluster (a running devcluster writes it)")
	cluster := fs.String("cluster", "", "with make run CLUSTERS=2: apply to this cluster, east (the default) or west, whose kubeconfig is --kubeconfig with -west added")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("apply: name one YAML file or more (make apply FILE=x.yaml)")
	}
	if *cluster != "" && *cluster != "east" {
		*kubeconfig += "-" + *cluster
	}
	raw, err := os.ReadFile(*kubeconfig)
	if errors.Is(err, os.ErrNotExist) && *cluster != "" && *cluster != "east" {
		return fmt.Errorf("apply: no %s: is `make run CLUSTERS=2` running? (or pass --kubeconfig)", *kubeconfig)
	}
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("apply: no %s: is `make run` running? (or pass --kubeconfig)", *kubeconfig)
	}
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(raw)
	if err != nil {
		return fmt.Errorf("apply: %s: %w", *kubeconfig, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := kubeapply.Files(ctx, cfg, fs.Args()...); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	where := ""
	if *cluster != "" {
		where = " to " + *cluster
	}
	fmt.Fprintf(stdout, "applied %s%s\n", strings.Join(fs.Args(), ", "), where)
	return nil
}
