// Command xdsload measures `metasync serve --xds-listen` fanning out to
// many xDS clients on a real control plane (the pinned binaries of the
// tests: KUBEBUILDER_ASSETS). It creates -targets AppModels (model-I
// served by app-I) and an EndpointSlice per app, starts the given
// metasync binary with the reference setup's config (its chain
// model-to-endpoints), and
// connects -clients raw ADS clients (go-control-plane's types over
// grpc-go, each on a connection of its own, in this process), client C
// following target C mod -targets as a gRPC client does: its Listener,
// RouteConfiguration, Cluster and ClusterLoadAssignment, each response
// ACKed. One change stream of the HTTP API per target
// (/v1/chains/model-to-endpoints/keys/model-I?watch=true) is the
// reference: when the write is visible.
//
// Then -rate writes a second for -for, spread over the targets: each
// replaces the endpoints of one app's slice with a fixed address and a
// marker address of its own (10.200.X.Y), so that each client's
// assignment says which write it holds. Printed:
//
//   - the daemon's resident memory before the clients connect and with
//     them connected, and the difference per client;
//   - per write, the time from the write's start (the PATCH sent) to
//     the HTTP stream's frame (visible), to the first and to the last of
//     the target's xDS clients: p50, p99, max;
//   - the daemon's CPU time during the writes, per write and per
//     assignment pushed (metasync_xds_pushes_total{type="endpoint"}).
//
// Not part of `make test`:
//
//	go build -o /tmp/metasync ./cmd/metasync
//	KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh) go run ./hack/xdsload -bin /tmp/metasync
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/internal/testenv"
)

const ns = "xdsload"

// The four resource types, as a gRPC client asks for them.
const (
	typeListener = "type.googleapis.com/envoy.config.listener.v3.Listener"
	typeRoute    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	typeCluster  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	typeEndpoint = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

func main() {
	bin := flag.String("bin", "", "the metasync binary to measure (required)")
	clients := flag.Int("clients", 1000, "xDS clients, each on a connection of its own")
	targets := flag.Int("targets", 10, "targets (models), the clients spread over them")
	rate := flag.Int("rate", 100, "writes a second, spread over the targets")
	dur := flag.Duration("for", 20*time.Second, "how long to write")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "xdsload: -bin is required")
		os.Exit(2)
	}
	if err := run(*bin, *clients, *targets, *rate, *dur); err != nil {
		fmt.Fprintln(os.Stderr, "xdsload:", err)
		os.Exit(1)
	}
}

// marker is the address of write seq.
func marker(seq int) string { return fmt.Sprintf("10.200.%d.%d", seq/250, seq%250+1) }

// seqOf reads the write of a marker address, or -1.
func seqOf(addr string) int {
	var a, b int
	if _, err := fmt.Sscanf(addr, "10.200.%d.%d", &a, &b); err != nil {
		return -1
	}
	return a*250 + b - 1
}

// slicePatch is the merge patch that makes app's slice hold the fixed
// address and seq's marker.
func slicePatch(seq int) []byte {
	b, _ := json.Marshal(map[string]any{"endpoints": []any{
		map[string]any{"addresses": []string{"10.100.0.1"}, "conditions": map[string]any{"ready": true}},
		map[string]any{"addresses": []string{marker(seq)}, "conditions": map[string]any{"ready": true}},
	}})
	return b
}

// arrivals records when each write was seen, by whom.
type arrivals struct {
	mu      sync.Mutex
	start   map[int]time.Time
	visible map[int]time.Time
	clients map[int][]time.Time // xDS clients that got it
	target  map[int]int
}

func (a *arrivals) saw(seq int, at time.Time, xds bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if xds {
		a.clients[seq] = append(a.clients[seq], at)
	} else if _, ok := a.visible[seq]; !ok {
		a.visible[seq] = at
	}
}

func run(bin string, clients, targets, rate int, dur time.Duration) error {
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer env.Stop()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "xdsload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := kubeapply.Files(ctx, env.Config, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml")); err != nil {
		return err
	}
	var manifest strings.Builder
	for i := range targets {
		fmt.Fprintf(&manifest, "---\napiVersion: iidp.com/v1\nkind: AppModel\nmetadata: {name: app-%d, namespace: %s, labels: {iidp: iidp}}\nspec: {type: model, version: '1', models: [model-%d]}\n", i, ns, i)
		fmt.Fprintf(&manifest, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: app-%d, namespace: %s, labels: {kubernetes.io/service-name: app-%d}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints: [{addresses: [10.100.0.1], conditions: {ready: true}}]\n", i, ns, i)
	}
	objects := filepath.Join(dir, "objects.yaml")
	if err := os.WriteFile(objects, []byte(manifest.String()), 0o600); err != nil {
		return err
	}
	// The CRD is established before its objects can be applied.
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if err = kubeapply.Files(ctx, env.Config, objects); err == nil || time.Now().After(end) {
			break
		}
	}
	if err != nil {
		return err
	}

	addr, xdsAddr := freeAddr(), freeAddr()
	config := filepath.Join(dir, "config.yaml")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg, err := testenv.ReferenceConfig(ns)
	if err != nil {
		return err
	}
	if err := os.WriteFile(config, cfg, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		return err
	}
	logs := &testenv.Buffer{}
	cmd := exec.Command(bin, "serve", "--config", config, "--kubeconfig", kubeconfig, "--listen", addr, "--xds-listen", xdsAddr, "--log-level", "warn")
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(end) {
			return fmt.Errorf("the daemon is not ready after 60 s:\n%s", logs)
		}
	}
	time.Sleep(2 * time.Second)
	before, heapBefore := rss(pid), heap(addr)
	fmt.Printf("binary: %s\nclients %d on %d targets, %d writes/s for %s\n", bin, clients, targets, rate, dur)
	fmt.Printf("daemon resident before the clients: %s\n", mib(before))

	got := &arrivals{start: map[int]time.Time{}, visible: map[int]time.Time{}, clients: map[int][]time.Time{}, target: map[int]int{}}
	// The reference: one change stream per target.
	for i := range targets {
		go follow(addr, i, got)
	}
	var ready sync.WaitGroup
	var failed atomic.Int64
	t0 := time.Now()
	conns := make(chan *grpc.ClientConn, clients)
	sem := make(chan struct{}, 50) // connecting at most 50 at once
	for c := range clients {
		ready.Add(1)
		sem <- struct{}{}
		go func() {
			first := true
			// client returns when its stream ends: before its first
			// assignment, it failed.
			_ = client(xdsAddr, c, c%targets, got, conns, func() {
				if first {
					first = false
					<-sem
					ready.Done()
				}
			})
			if first {
				failed.Add(1)
				<-sem
				ready.Done()
			}
		}()
	}
	ready.Wait()
	fmt.Printf("clients connected, each with its first assignment, in %s (%d failed)\n", time.Since(t0).Round(time.Millisecond), failed.Load())
	time.Sleep(3 * time.Second)
	with, heapWith := rss(pid), heap(addr)
	fmt.Printf("daemon resident with them: %s, %s more per client; heap in use %s more per client\n", mib(with), kib((with-min(with, before))/uint64(clients)),
		kib((heapWith-min(heapWith, heapBefore))/uint64(clients)))
	fmt.Printf("metasync_xds_clients %s\n", metric(addr, "metasync_xds_clients"))

	pushes0, _ := strconv.ParseFloat(metric(addr, `metasync_xds_pushes_total{type="endpoint"}`), 64)
	cpu0, self0 := cpuTime(pid), cpuTime(os.Getpid())
	wall0 := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	seq := 0
	var writes sync.WaitGroup
	var writeErrs atomic.Int64
	for end := time.Now().Add(dur); time.Now().Before(end); <-tick.C {
		s, target := seq, seq%targets
		seq++
		got.mu.Lock()
		got.start[s] = time.Now()
		got.target[s] = target
		got.mu.Unlock()
		writes.Go(func() {
			_, err := env.Kube.DiscoveryV1().EndpointSlices(ns).Patch(ctx, fmt.Sprintf("app-%d", target), types.MergePatchType, slicePatch(s), metav1.PatchOptions{})
			if err != nil {
				writeErrs.Add(1)
			}
		})
	}
	tick.Stop()
	writes.Wait()
	time.Sleep(3 * time.Second) // the last pushes arrive
	cpu, self := cpuTime(pid)-cpu0, cpuTime(os.Getpid())-self0
	wall := time.Since(wall0)
	pushes1, _ := strconv.ParseFloat(metric(addr, `metasync_xds_pushes_total{type="endpoint"}`), 64)
	pushes := pushes1 - pushes0

	perTarget := clients / targets
	var vis, firstLat, lastLat []time.Duration
	complete, partial := 0, 0
	got.mu.Lock()
	for s := range seq {
		start := got.start[s]
		if v, ok := got.visible[s]; ok {
			vis = append(vis, v.Sub(start))
		}
		ts := got.clients[s]
		if len(ts) == 0 {
			continue
		}
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		firstLat = append(firstLat, ts[0].Sub(start))
		if len(ts) >= perTarget+boolInt(got.target[s] < clients%targets) {
			complete++
			lastLat = append(lastLat, ts[len(ts)-1].Sub(start))
		} else {
			partial++
		}
	}
	got.mu.Unlock()
	fmt.Printf("writes: %d (%d failed); seen by every client of the target: %d, by some (a later write came first): %d\n", seq, writeErrs.Load(), complete, partial)
	fmt.Printf("write → visible (HTTP stream):  %s\n", quantiles(vis))
	fmt.Printf("write → first xDS client:       %s\n", quantiles(firstLat))
	fmt.Printf("write → last xDS client:        %s\n", quantiles(lastLat))
	fmt.Printf("daemon CPU during the writes: %s in %s (%.2f cores); %.0f assignments pushed; %s per write, %s per push\n",
		cpu.Round(time.Millisecond), wall.Round(time.Millisecond), cpu.Seconds()/wall.Seconds(), pushes,
		(cpu / time.Duration(max(seq, 1))).Round(time.Microsecond), time.Duration(float64(cpu)/max(pushes, 1)).Round(100*time.Nanosecond))
	fmt.Printf("this process (clients, writer, control plane's client side) meanwhile: %.2f cores\n", self.Seconds()/wall.Seconds())
	if n := strings.Count(logs.String(), `"level":"ERROR"`); n > 0 {
		fmt.Printf("daemon errors logged: %d\n", n)
	}
	close(conns)
	for c := range conns {
		c.Close()
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// client follows target over one ADS stream until the stream ends:
// every response ACKed, every assignment's marker recorded; ready is
// called at its first assignment.
func client(xdsAddr string, id, target int, got *arrivals, conns chan<- *grpc.ClientConn, ready func()) error {
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	conns <- conn
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(context.Background())
	if err != nil {
		return err
	}
	name := fmt.Sprintf("chains/model-to-endpoints/model-%d", target)
	names := map[string]string{typeListener: name, typeRoute: name, typeCluster: name, typeEndpoint: name}
	node := fmt.Sprintf(`xdsload-%d`, id)
	for _, typeURL := range []string{typeListener, typeRoute, typeCluster, typeEndpoint} {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: []string{names[typeURL]}}
		if typeURL == typeListener {
			req.Node = nodeOf(node)
		}
		if err := stream.Send(req); err != nil {
			return err
		}
	}
	for {
		r, err := stream.Recv()
		if err != nil {
			return err
		}
		at := time.Now()
		if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: []string{names[r.GetTypeUrl()]}, ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()}); err != nil {
			return err
		}
		if r.GetTypeUrl() != typeEndpoint {
			continue
		}
		ready()
		for _, a := range r.GetResources() {
			cla := &endpointv3.ClusterLoadAssignment{}
			if a.UnmarshalTo(cla) != nil {
				continue
			}
			for _, l := range cla.GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					if s := seqOf(e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()); s >= 0 {
						got.saw(s, at, true)
					}
				}
			}
		}
	}
}

func nodeOf(id string) *corev3.Node { return &corev3.Node{Id: id} }

// follow reads the HTTP change stream of target's model, recording each
// marker when first seen.
func follow(addr string, target int, got *arrivals) {
	resp, err := http.Get(fmt.Sprintf("http://%s/v1/chains/model-to-endpoints/keys/model-%d?watch=true", addr, target))
	if err != nil {
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
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
				got.saw(s, at, false)
			}
		}
	}
}

func quantiles(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	slices.Sort(d)
	q := func(p float64) time.Duration {
		return d[min(len(d)-1, int(p*float64(len(d))))].Round(10 * time.Microsecond)
	}
	return fmt.Sprintf("p50 %s, p99 %s, max %s (n=%d)", q(0.5), q(0.99), d[len(d)-1].Round(10*time.Microsecond), len(d))
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// metric is the value of the first sample line of /metrics that starts
// with name, or "".
func metric(addr, name string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return rest
		}
	}
	return ""
}

// cpuTime is the user and system CPU time of pid.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: utime and
	// stime are the 12th and 13th (clock ticks of 1/100 s).
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	u, _ := strconv.ParseInt(fields[11], 10, 64)
	s, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

func rss(pid int) uint64 { return testenv.Resident(pid) }

// heap is the daemon's go_memstats_heap_inuse_bytes.
func heap(addr string) uint64 {
	v, _ := strconv.ParseFloat(metric(addr, "go_memstats_heap_inuse_bytes"), 64)
	return uint64(v)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b uint64) string { return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10)) }
