// Command xdsload measures `metasync serve --xds-listen` fanning out to
// many xDS clients on a real control plane (the pinned binaries of the
// tests: KUBEBUILDER_ASSETS), and, with -peer, the server a user would
// build instead (hack/xdspeer: go-control-plane's server and
// LinearCaches over grpc-go, fed by client-go informers) with the same
// clients and writes, so that one run prints both.
//
// It creates -targets AppModels (model-I served by app-I) and an
// EndpointSlice per app holding -endpoints addresses, starts the server
// with the reference setup's config (its chain model-to-endpoints), and
// connects -clients raw ADS clients (go-control-plane's types, each
// client one ADS stream and -streams-per-conn streams to an HTTP/2
// connection), client C following -follow targets from C mod -targets
// on as a gRPC client does: for each, its Listener, RouteConfiguration,
// Cluster and ClusterLoadAssignment, each response ACKed. A client is
// connected once it holds the assignment of every target it follows;
// connecting stops after -give-up clients failed to within
// -connect-timeout. The clients' HTTP/2 is either grpc-go (-client grpc:
// a ClientConn per connection) or x/net/http2's framer (-client h2: one
// goroutine per connection, a real HTTP/2 connection at a fraction of
// the memory, for 10,000 clients in one process).
//
// Then -rate writes a second for -for, round robin over the targets:
// each replaces the endpoints of one app's slice with -endpoints - 1
// fixed addresses and a marker address of its own (10.200.X.Y), so that
// each client's assignment says which write it holds. Printed, per
// server:
//
//   - its resident memory (VmRSS) before the clients connect and with
//     them connected, and the difference per client (and heap in use);
//   - per write, the time from the write's start (the PATCH sent) to the
//     apiserver's watch event in this process, to the daemon's HTTP
//     change stream of the index (visible; the daemon only), and to the
//     first and to the last xDS client following the target: p50, p99,
//     max;
//   - the server's CPU time per write, and per assignment pushed; the
//     responses of assignments it counted (metasync_xds_pushes_total,
//     xdspeer_xds_pushes_total) and the clients received, the largest
//     response a client received (grpc-go's clients refuse one over 4
//     MiB by default); this process's own memory and CPU.
//
// -attack measures one abuse instead of the fan-out, against each
// server:
//
//   - idle-streams: -attack-conns HTTP/2 connections, each with one ADS
//     stream that never sends a request; then the time a legitimate
//     client (grpc-go) takes to its first response, at most 20 s.
//   - stall: a client whose HTTP/2 receive window is 0 asks for a
//     Listener; then the time of GET /metrics and GET /v1/xds/clients on
//     the server's HTTP port, and of a legitimate client's first
//     response, at most 60 s each.
//   - many-streams: one caller opens -attack-streams streams (4 to a
//     connection) each asking for 1,000 names of each type; the
//     server's goroutines (go_goroutines) and resident memory.
//
// The process raises its open file limit (RLIMIT_NOFILE) to the hard
// limit, for itself and the servers it starts. Not part of `make test`:
//
//	go build -o /tmp/metasync ./cmd/metasync
//	KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh) go run ./hack/xdsload -bin /tmp/metasync
//	KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh) go run ./hack/xdsload -bin /tmp/metasync -peer -client h2 -clients 10000 -targets 100 -rate 20
//	KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh) go run ./hack/xdsload -bin /tmp/metasync -peer -clients 100 -targets 1000 -follow 1000 -endpoints 100 -rate 20
//	KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh) go run ./hack/xdsload -bin /tmp/metasync -attack idle-streams
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

const ns = "xdsload"

// options are the flags.
type options struct {
	bin, peerBin   string
	peer           bool
	clients        int
	targets        int
	follow         int
	endpoints      int
	rate           int
	dur            time.Duration
	client         string
	perConn        int
	connectTimeout time.Duration
	giveUp         int
	attack         string
	attackConns    int
	attackStreams  int
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "", "the metasync binary to measure")
	flag.BoolVar(&o.peer, "peer", false, "also measure hack/xdspeer, after the daemon (alone without -bin)")
	flag.StringVar(&o.peerBin, "peer-bin", "", "a built hack/xdspeer (default: built from this repository)")
	flag.IntVar(&o.clients, "clients", 1000, "xDS clients, one ADS stream each")
	flag.IntVar(&o.targets, "targets", 10, "targets (models)")
	flag.IntVar(&o.follow, "follow", 1, "targets each client follows: client C follows targets C, C+1, ... mod -targets")
	flag.IntVar(&o.endpoints, "endpoints", 2, "addresses of each target (a write keeps all but one, and replaces that one with its marker)")
	flag.IntVar(&o.rate, "rate", 100, "writes a second, round robin over the targets")
	flag.DurationVar(&o.dur, "for", 20*time.Second, "how long to write")
	flag.StringVar(&o.client, "client", "grpc", "the clients' HTTP/2: grpc (grpc-go, a ClientConn per connection) or h2 (x/net/http2's framer, one goroutine per connection)")
	flag.IntVar(&o.perConn, "streams-per-conn", 1, "ADS streams (clients) on each HTTP/2 connection")
	flag.DurationVar(&o.connectTimeout, "connect-timeout", 20*time.Second, "how long a connection's clients may take to hold all their assignments")
	flag.IntVar(&o.giveUp, "give-up", 200, "stop connecting once this many clients failed to")
	flag.StringVar(&o.attack, "attack", "", "measure an abuse instead: idle-streams, stall or many-streams")
	flag.IntVar(&o.attackConns, "attack-conns", 4096, "idle-streams: connections, one idle stream each")
	flag.IntVar(&o.attackStreams, "attack-streams", 20, "many-streams: streams of 1,000 names each")
	flag.Parse()
	switch {
	case o.bin == "" && !o.peer:
		fmt.Fprintln(os.Stderr, "xdsload: -bin or -peer is required")
		os.Exit(2)
	case o.client != "grpc" && o.client != "h2":
		fmt.Fprintln(os.Stderr, "xdsload: -client is grpc or h2")
		os.Exit(2)
	case o.attack != "" && o.attack != "idle-streams" && o.attack != "stall" && o.attack != "many-streams":
		fmt.Fprintln(os.Stderr, "xdsload: -attack is idle-streams, stall or many-streams")
		os.Exit(2)
	case o.endpoints < 2 || o.endpoints > 250*250:
		fmt.Fprintln(os.Stderr, "xdsload: -endpoints from 2")
		os.Exit(2)
	}
	o.follow = min(max(o.follow, 1), o.targets)
	o.perConn = max(o.perConn, 1)
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "xdsload:", err)
		os.Exit(1)
	}
}

// raiseNoFile sets the open file limit to the hard limit, for this
// process and its children.
func raiseNoFile() uint64 {
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) != nil {
		return 0
	}
	r.Cur = r.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r)
	return r.Cur
}

// maxSeq bounds the writes of a run: markers are 10.200.0.1 to
// 10.200.255.250.
const maxSeq = 256 * 250

// marker is the address of write seq.
func marker(seq int) string { return fmt.Sprintf("10.200.%d.%d", seq/250, seq%250+1) }

// fixed is the i-th address that no write changes.
func fixed(i int) string { return fmt.Sprintf("10.100.%d.%d", i/250, i%250+1) }

// seqOf reads the write of a marker address, or -1.
func seqOf(addr string) int {
	if !strings.HasPrefix(addr, "10.200.") {
		return -1
	}
	var a, b int
	if _, err := fmt.Sscanf(addr, "10.200.%d.%d", &a, &b); err != nil {
		return -1
	}
	return a*250 + b - 1
}

// endpointsOf is a slice's endpoints: the fixed addresses 0 to n-2,
// and last.
func endpointsOf(n int, last string) []any {
	var eps []any
	for i := range n - 1 {
		eps = append(eps, map[string]any{"addresses": []string{fixed(i)}, "conditions": map[string]any{"ready": true}})
	}
	return append(eps, map[string]any{"addresses": []string{last}, "conditions": map[string]any{"ready": true}})
}

// slicePatch is the merge patch that makes a slice hold the fixed
// addresses and seq's marker.
func slicePatch(n, seq int) []byte {
	b, _ := json.Marshal(map[string]any{"endpoints": endpointsOf(n, marker(seq))})
	return b
}

// How a write was seen.
const (
	sawXDS  = iota // by an xDS client
	sawHTTP        // on the daemon's HTTP change stream
	sawAPI         // as the apiserver's watch event
)

// arrivals records when each write of one run was seen, by whom.
type arrivals struct {
	mu      sync.Mutex
	base    int // the run's first write: markers below are older
	start   map[int]time.Time
	target  map[int]int
	visible map[int]time.Time
	api     map[int]time.Time
	clients map[int][]time.Time // xDS clients that got it
	last    time.Time           // the last xDS arrival
}

func newArrivals(base int) *arrivals {
	return &arrivals{base: base, start: map[int]time.Time{}, target: map[int]int{}, visible: map[int]time.Time{}, api: map[int]time.Time{}, clients: map[int][]time.Time{}}
}

func (a *arrivals) saw(seq int, at time.Time, how int) {
	if a == nil || seq < a.base {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch how {
	case sawXDS:
		a.clients[seq] = append(a.clients[seq], at)
		a.last = at
	case sawHTTP:
		if _, ok := a.visible[seq]; !ok {
			a.visible[seq] = at
		}
	case sawAPI:
		if _, ok := a.api[seq]; !ok {
			a.api[seq] = at
		}
	}
}

// caughtUp tells whether the last write to each target, of writes from
// to to, reached every client that follows it.
func (a *arrivals) caughtUp(from, to int, followers []int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := map[int]bool{}
	for n := to - 1; n >= from; n-- {
		t := a.target[n]
		if seen[t] {
			continue
		}
		seen[t] = true
		if len(a.clients[n]) < followers[t] {
			return false
		}
	}
	return true
}

func (a *arrivals) lastXDS() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

func run(o options) error {
	nofile := raiseNoFile()
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer env.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "xdsload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := createObjects(ctx, env, dir, o); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		return err
	}
	// The apiserver's watch events, the reference of every run.
	var current atomic.Pointer[arrivals]
	go watchSlices(ctx, env, &current)

	type which struct{ bin, peer string }
	var servers []which
	if o.bin != "" {
		servers = append(servers, which{bin: o.bin})
	}
	if o.peer {
		peer := o.peerBin
		if peer == "" {
			peer = filepath.Join(dir, "xdspeer")
			build := exec.Command("go", "build", "-o", peer, "./hack/xdspeer")
			build.Dir, build.Stdout, build.Stderr = testenv.Root(), os.Stderr, os.Stderr
			if err := build.Run(); err != nil {
				return fmt.Errorf("building hack/xdspeer: %w", err)
			}
		}
		servers = append(servers, which{peer: peer})
	}
	fmt.Printf("open file limit %d; %d targets of %d endpoints each\n", nofile, o.targets, o.endpoints)
	var results []*result
	seq := 0
	for _, w := range servers {
		s, err := startServer(w.bin, w.peer, dir, kubeconfig)
		if err != nil {
			return err
		}
		if o.attack != "" {
			err = attack(o, s)
		} else {
			var r *result
			r, err = measure(ctx, o, env, s, &current, &seq)
			results = append(results, r)
		}
		if n := strings.Count(s.logs.String(), `"level":"ERROR"`); n > 0 {
			fmt.Printf("%s errors logged: %d\n", s.name, n)
		}
		s.stop()
		if err != nil {
			return err
		}
	}
	if len(results) > 1 {
		printTable(results)
	}
	return nil
}

// createObjects creates the namespace, the AppModel CRD, and the
// AppModels and EndpointSlices of the targets.
func createObjects(ctx context.Context, env *testenv.Env, dir string, o options) error {
	if _, err := env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := kubeapply.Files(ctx, env.Config, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")); err != nil {
		return err
	}
	var manifest strings.Builder
	eps, _ := json.Marshal(endpointsOf(o.endpoints, fixed(o.endpoints-1)))
	for i := range o.targets {
		fmt.Fprintf(&manifest, "---\napiVersion: iidp.com/v1\nkind: AppModel\nmetadata: {name: app-%d, namespace: %s, labels: {iidp: iidp}}\nspec: {type: model, version: '1', models: [model-%d]}\n", i, ns, i)
		fmt.Fprintf(&manifest, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: app-%d, namespace: %s, labels: {kubernetes.io/service-name: app-%d}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints: %s\n", i, ns, i, eps)
	}
	objects := filepath.Join(dir, "objects.yaml")
	if err := os.WriteFile(objects, []byte(manifest.String()), 0o600); err != nil {
		return err
	}
	// The CRD is established before its objects can be applied.
	var err error
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if err = kubeapply.Files(ctx, env.Config, objects); err == nil || time.Now().After(end) {
			break
		}
	}
	return err
}

// watchSlices records the markers of the apiserver's watch events of
// the slices in the current run's arrivals.
func watchSlices(ctx context.Context, env *testenv.Env, current *atomic.Pointer[arrivals]) {
	rv := ""
	for ctx.Err() == nil {
		w, err := env.Kube.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			at := time.Now()
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type == watch.Error {
				rv = ""
				continue
			}
			rv = s.ResourceVersion
			for _, e := range s.Endpoints {
				for _, a := range e.Addresses {
					if seq := seqOf(a); seq >= 0 {
						current.Load().saw(seq, at, sawAPI)
					}
				}
			}
		}
		w.Stop()
	}
}

// followIndex reads the daemon's HTTP change stream of the index of
// the slices' endpoints, recording each marker when first seen.
func followIndex(ctx context.Context, addr string, got *arrivals) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/indexes/service-to-endpoints/keys?watch=true", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		at := time.Now()
		var frame struct {
			Values []string `json:"values"`
		}
		if json.Unmarshal(sc.Bytes(), &frame) != nil {
			continue
		}
		for _, v := range frame.Values {
			host, _, _ := net.SplitHostPort(v)
			if s := seqOf(host); s >= 0 {
				got.saw(s, at, sawHTTP)
			}
		}
	}
}

// result is what one run measured.
type result struct {
	server                string
	rssBefore, rssWith    uint64
	heapBefore, heapWith  uint64
	goroutines            float64
	clients, connected    int
	connectTime           time.Duration
	writes, complete      int
	api, vis, first, last []time.Duration
	cpu, wall             time.Duration
	pushes                float64
	edsResponses, cla     int64
	maxResponse           int64
	ended                 int64
	selfRSS               uint64
	scrape                time.Duration
	machine               float64 // cores busy while writing
	selfCores             float64
}

// measure connects the clients to s, writes, and prints what it took.
func measure(ctx context.Context, o options, env *testenv.Env, s *server, current *atomic.Pointer[arrivals], seq *int) (*result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	base := *seq
	got := newArrivals(base)
	current.Store(got)
	if s.name == "metasync" {
		go followIndex(ctx, s.http, got)
	}
	time.Sleep(3 * time.Second)
	r := &result{server: s.name, clients: o.clients}
	r.rssBefore, r.heapBefore = rss(s.pid), s.heap()
	debug.FreeOSMemory() // what an earlier run left is not this one's
	selfBefore := rss(os.Getpid())
	fmt.Printf("\n== %s (%s)\n", s.name, s.cmd.Path)
	fmt.Printf("clients %d (%s, %d a connection) following %d of %d targets each, %d writes/s for %s\n",
		o.clients, o.client, o.perConn, o.follow, o.targets, o.rate, o.dur)
	fmt.Printf("resident before the clients: %s (heap in use %s)\n", mib(r.rssBefore), mib(r.heapBefore))

	t := &tally{}
	clients := make([]*adsClient, o.clients)
	for c := range clients {
		var ts []int
		for j := range o.follow {
			ts = append(ts, (c+j)%o.targets)
		}
		clients[c] = newClient(c, ts, got, t)
	}
	var (
		mu     sync.Mutex
		conns  []conn
		wg     sync.WaitGroup
		failed atomic.Int64
	)
	t0 := time.Now()
	sem := make(chan struct{}, 50) // connecting at most 50 connections at once
	launched := 0
	for g := 0; g < len(clients) && failed.Load() < int64(o.giveUp); g += o.perConn {
		sem <- struct{}{}
		group := clients[g:min(g+o.perConn, len(clients))]
		launched += len(group)
		wg.Go(func() {
			c, n := dialGroup(o.client, s.xds, group, o.connectTimeout)
			<-sem
			failed.Add(int64(len(group) - n))
			if c != nil {
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.connectTime = time.Since(t0)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	followers := make([]int, o.targets)
	for _, a := range clients {
		select {
		case <-a.ready:
			a.counted.Store(true)
			r.connected++
			for _, tg := range a.targets {
				followers[tg]++
			}
		default:
		}
	}
	fmt.Printf("clients connected, each holding its assignments: %d of %d in %s (%d failed; %d not tried)\n",
		r.connected, o.clients, r.connectTime.Round(time.Millisecond), failed.Load(), o.clients-launched)
	if r.connected == 0 {
		return r, errors.New("no client connected")
	}
	time.Sleep(3 * time.Second)
	r.rssWith, r.heapWith = rss(s.pid), s.heap()
	r.goroutines = s.value("go_goroutines")
	debug.FreeOSMemory()
	self := rss(os.Getpid())
	r.selfRSS = self - min(self, selfBefore)
	fmt.Printf("resident with them: %s, %s more per client; heap in use %s, %s more per client; %.0f goroutines; %s_clients %s\n",
		mib(r.rssWith), kib((r.rssWith-min(r.rssWith, r.rssBefore))/uint64(r.connected)),
		mib(r.heapWith), kib((r.heapWith-min(r.heapWith, r.heapBefore))/uint64(r.connected)), r.goroutines,
		strings.TrimSuffix(s.prefix, "_"), s.metric(s.prefix+"clients"))

	scrape := time.Now()
	pushes0 := s.pushes()
	r.scrape = time.Since(scrape)
	eds0, cla0 := t.edsResponses.Load(), t.assignments.Load()
	cpu0, self0, busy0 := cpuTime(s.pid), cpuTime(os.Getpid()), machineBusy()
	wall0 := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(o.rate))
	var writes sync.WaitGroup
	var writeErrs atomic.Int64
	for end := time.Now().Add(o.dur); time.Now().Before(end) && *seq < maxSeq; <-tick.C {
		n, target := *seq, (*seq-base)%o.targets
		*seq++
		got.mu.Lock()
		got.start[n] = time.Now()
		got.target[n] = target
		got.mu.Unlock()
		writes.Go(func() {
			_, err := env.Kube.DiscoveryV1().EndpointSlices(ns).Patch(ctx, fmt.Sprintf("app-%d", target), types.MergePatchType, slicePatch(o.endpoints, n), metav1.PatchOptions{})
			if err != nil {
				writeErrs.Add(1)
			}
		})
	}
	tick.Stop()
	writes.Wait()
	writesEnd := time.Now()
	// The last pushes arrive: until every client holds the last write
	// of each target it follows (at most 2 minutes).
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end) && !got.caughtUp(base, *seq, followers); {
		time.Sleep(100 * time.Millisecond)
	}
	cpu, selfCPU, busy := cpuTime(s.pid)-cpu0, cpuTime(os.Getpid())-self0, machineBusy()-busy0
	r.wall = later(got.lastXDS(), writesEnd).Sub(wall0)
	r.cpu = cpu
	pushes1 := s.pushes()
	r.pushes = pushes1 - pushes0
	r.edsResponses, r.cla = t.edsResponses.Load()-eds0, t.assignments.Load()-cla0
	r.maxResponse, r.ended = t.maxResponse.Load(), t.ended.Load()
	r.selfCores = selfCPU.Seconds() / time.Since(wall0).Seconds()

	partial := 0
	got.mu.Lock()
	for n := base; n < *seq; n++ {
		r.writes++
		start := got.start[n]
		if v, ok := got.api[n]; ok {
			r.api = append(r.api, v.Sub(start))
		}
		if v, ok := got.visible[n]; ok {
			r.vis = append(r.vis, v.Sub(start))
		}
		ts := got.clients[n]
		if len(ts) == 0 {
			continue
		}
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		r.first = append(r.first, ts[0].Sub(start))
		if len(ts) >= followers[got.target[n]] {
			r.complete++
			r.last = append(r.last, ts[len(ts)-1].Sub(start))
		} else {
			partial++
		}
	}
	got.mu.Unlock()
	fmt.Printf("writes: %d (%d failed); seen by every client of the target: %d, by some (a later write came first): %d\n", r.writes, writeErrs.Load(), r.complete, partial)
	fmt.Printf("write → apiserver watch event:  %s\n", quantiles(r.api))
	if s.name == "metasync" {
		fmt.Printf("write → visible (HTTP stream):  %s\n", quantiles(r.vis))
	}
	fmt.Printf("write → first xDS client:       %s\n", quantiles(r.first))
	fmt.Printf("write → last xDS client:        %s\n", quantiles(r.last))
	fmt.Printf("%s CPU: %s in %s (%.2f cores); %s per write; assignment responses: %.0f counted by the server, %d received holding %d assignments; %s per assignment received\n",
		s.name, cpu.Round(time.Millisecond), r.wall.Round(time.Millisecond), cpu.Seconds()/r.wall.Seconds(),
		(cpu / time.Duration(max(r.writes, 1))).Round(time.Microsecond), r.pushes, r.edsResponses, r.cla,
		time.Duration(float64(cpu)/float64(max(r.cla, 1))).Round(100*time.Nanosecond))
	fmt.Printf("the server's count of assignment responses: %.0f → %.0f; GET /metrics with the clients connected took %s\n", pushes0, pushes1, r.scrape.Round(time.Millisecond))
	r.machine = busy.Seconds() / time.Since(wall0).Seconds()
	fmt.Printf("the machine meanwhile: %.2f cores busy of %d (the server, this process, the apiserver and etcd, and anything else running)\n", r.machine, runtime.NumCPU())
	fmt.Printf("largest response a client received: %s; streams that ended while measured: %d\n", kib(uint64(r.maxResponse)), r.ended)
	fmt.Printf("this process (clients, writer, control plane's client side): %s more resident with the clients (%s per client), %.2f cores while writing\n",
		mib(r.selfRSS), kib(r.selfRSS/uint64(r.connected)), r.selfCores)
	return r, nil
}

// printTable prints the runs side by side.
func printTable(rs []*result) {
	row := func(name string, f func(r *result) string) {
		fmt.Printf("| %s |", name)
		for _, r := range rs {
			fmt.Printf(" %s |", f(r))
		}
		fmt.Println()
	}
	fmt.Println()
	row("", func(r *result) string { return r.server })
	row("---", func(*result) string { return "---" })
	row("clients connected", func(r *result) string {
		return fmt.Sprintf("%d of %d in %s", r.connected, r.clients, r.connectTime.Round(10*time.Millisecond))
	})
	row("resident before → with clients", func(r *result) string { return mib(r.rssBefore) + " → " + mib(r.rssWith) })
	row("resident per client", func(r *result) string {
		return kib((r.rssWith - min(r.rssWith, r.rssBefore)) / uint64(max(r.connected, 1)))
	})
	row("heap in use per client", func(r *result) string {
		return kib((r.heapWith - min(r.heapWith, r.heapBefore)) / uint64(max(r.connected, 1)))
	})
	row("goroutines with clients", func(r *result) string { return fmt.Sprintf("%.0f", r.goroutines) })
	row("writes (seen by every client)", func(r *result) string { return fmt.Sprintf("%d (%d)", r.writes, r.complete) })
	row("write → apiserver event p50 / p99", func(r *result) string { return p5099(r.api) })
	row("write → first client p50 / p99", func(r *result) string { return p5099(r.first) })
	row("write → last client p50 / p99 / max", func(r *result) string { return p5099(r.last) + " / " + qmax(r.last) })
	row("CPU (cores)", func(r *result) string {
		return fmt.Sprintf("%s (%.2f)", r.cpu.Round(10*time.Millisecond), r.cpu.Seconds()/r.wall.Seconds())
	})
	row("machine busy while writing (cores)", func(r *result) string { return fmt.Sprintf("%.2f", r.machine) })
	row("CPU per write", func(r *result) string {
		return (r.cpu / time.Duration(max(r.writes, 1))).Round(10 * time.Microsecond).String()
	})
	row("assignment responses counted / received", func(r *result) string { return fmt.Sprintf("%.0f / %d", r.pushes, r.edsResponses) })
	row("assignments received", func(r *result) string { return fmt.Sprint(r.cla) })
	row("largest response", func(r *result) string { return kib(uint64(r.maxResponse)) })
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func quantile(d []time.Duration, p float64) time.Duration {
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

func quantiles(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	slices.Sort(d)
	q := func(p float64) time.Duration { return quantile(d, p).Round(10 * time.Microsecond) }
	return fmt.Sprintf("p50 %s, p99 %s, max %s (n=%d)", q(0.5), q(0.99), d[len(d)-1].Round(10*time.Microsecond), len(d))
}

func p5099(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	slices.Sort(d)
	return fmt.Sprintf("%s / %s", quantile(d, 0.5).Round(100*time.Microsecond), quantile(d, 0.99).Round(100*time.Microsecond))
}

func qmax(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	return slices.Max(d).Round(100 * time.Microsecond).String()
}
