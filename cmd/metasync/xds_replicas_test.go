package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// replica is one `metasync serve --xds-listen` of a test of replicas.
type replica struct {
	d         *daemon
	http, xds string
}

// startReplica starts `metasync serve` on config and kubeconfig,
// serving HTTP on httpAddr and xDS on xdsAddr, and waits until it
// answers /livez. When t fails, it logs the replica's xDS clients
// (/v1/xds/clients), if it still runs.
func startReplica(t *testing.T, config, kubeconfig, httpAddr, xdsAddr string) *replica {
	t.Helper()
	r := &replica{http: httpAddr, xds: xdsAddr}
	r.d = start(t, nil, "--config", config, "--kubeconfig", kubeconfig, "--listen", httpAddr, "--xds-listen", xdsAddr)
	waitHTTP(t, r.d, httpAddr)
	t.Cleanup(func() {
		select {
		case <-r.d.done:
		default:
			if t.Failed() {
				if resp, err := http.Get(base(httpAddr) + "/v1/xds/clients"); err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					t.Logf("xDS clients of the replica on %s: %s", xdsAddr, b)
				}
			}
		}
	})
	return r
}

// kill ends the replica with SIGKILL: no drain, its connections reset.
func (r *replica) kill(t *testing.T) {
	t.Helper()
	if err := r.d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.d.done
}

// followed is the resource types that the replica's one xDS client
// asks it for (from /v1/xds/clients), sorted.
func (r *replica) followed(t *testing.T) []string {
	t.Helper()
	var st struct {
		Clients []struct {
			Types map[string]struct {
				Names []string `json:"names"`
			} `json:"types"`
		} `json:"clients"`
	}
	a := call(t, "GET", base(r.http)+"/v1/xds/clients")
	if err := json.Unmarshal([]byte(a.raw), &st); err != nil || len(st.Clients) != 1 {
		t.Fatalf("/v1/xds/clients: %s, want one client", a.raw)
	}
	var types []string
	for typ, ts := range st.Clients[0].Types {
		if len(ts.Names) > 0 {
			types = append(types, typ)
		}
	}
	slices.Sort(types)
	return types
}

// clients is the replica's metasync_xds_clients: its ADS streams open.
func (r *replica) clients(t *testing.T) string {
	t.Helper()
	return metric(t, base(r.http), "metasync_xds_clients")
}

// xdsBootstrap is a bootstrap for node id naming servers, in order, as
// its xds_servers (insecure channel credentials).
func xdsBootstrap(id string, servers ...string) string {
	type server struct {
		URI      string           `json:"server_uri"`
		Creds    []map[string]any `json:"channel_creds"`
		Features []string         `json:"server_features"`
	}
	b := struct {
		Servers []server          `json:"xds_servers"`
		Node    map[string]string `json:"node"`
	}{Node: map[string]string{"id": id}}
	for _, s := range servers {
		b.Servers = append(b.Servers, server{URI: s, Creds: []map[string]any{{"type": "insecure"}}, Features: []string{"xds_v3"}})
	}
	out, _ := json.Marshal(b)
	return string(out)
}

// replicaProxy stands for a Kubernetes Service in front of replicas:
// each connection it accepts goes to the first of its replicas, in
// order, that takes a connection (the next when dialing one fails), and
// ends when either side closes.
type replicaProxy struct {
	ln       net.Listener
	replicas []string

	mu     gosync.Mutex
	conns  map[net.Conn]bool
	closed bool
	wg     gosync.WaitGroup
}

// newReplicaProxy listens on a loopback port in front of replicas
// (host:port); it is closed when t ends.
func newReplicaProxy(t *testing.T, replicas ...string) *replicaProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replicaProxy{ln: ln, replicas: replicas, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// addr is where the proxy listens.
func (p *replicaProxy) addr() string { return p.ln.Addr().String() }

// accept takes connections until the listener is closed, each to the
// first replica that takes it, copied both ways.
func (p *replicaProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		var up net.Conn
		for _, r := range p.replicas {
			if up, err = net.DialTimeout("tcp", r, time.Second); err == nil {
				break
			}
		}
		if up == nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(up, c) })
		p.wg.Go(func() { p.pipe(c, up) })
	}
}

// pipe copies src to dst, then closes both.
func (p *replicaProxy) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// close stops accepting, closes every connection and waits for the
// copies to end.
func (p *replicaProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// sliceAway deletes the EndpointSlice ns/name and returns a function
// that creates it again; if not called, it is when t ends.
func sliceAway(t *testing.T, ns, name string) (restore func()) {
	t.Helper()
	ctx := context.Background()
	api := env.Kube.DiscoveryV1().EndpointSlices(ns)
	s, err := api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var once gosync.Once
	restore = func() {
		once.Do(func() {
			again := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: s.Labels},
				AddressType: s.AddressType, Endpoints: s.Endpoints, Ports: s.Ports}
			if _, err := api.Create(ctx, again, metav1.CreateOptions{}); err != nil {
				t.Errorf("create the slice %s/%s again: %v", ns, name, err)
			}
		})
	}
	t.Cleanup(restore)
	return restore
}

// answers waits until the replica's HTTP lookup of the chain
// model-to-endpoints for model answers exactly want.
func (r *replica) answers(t *testing.T, model string, want ...string) {
	t.Helper()
	testenv.Eventually(t, r.http+" answers "+model, func() string {
		a := call(t, "GET", base(r.http)+"/v1/chains/model-to-endpoints/keys/"+model)
		var got []string
		for _, v := range a.body["values"].([]any) {
			got = append(got, v.(string))
		}
		slices.Sort(got)
		if w := slices.Sorted(slices.Values(want)); !slices.Equal(got, w) {
			return a.raw
		}
		return ""
	})
}

const replicasTarget = "chains/model-to-endpoints/xds-model"

// TestXDSReplicasBehindOneAddress: two `serve --xds-listen` on one
// config behind one address (a TCP proxy, as a Service in front of a
// Deployment's pods), and grpc-go's xDS client (its own process) whose
// bootstrap names that address only. The replica it is connected to is
// killed (SIGKILL) while it calls: no call fails, it reconnects to the
// other replica, which sends it its state of the world, and it follows
// the answer's changes (a slice deleted, then created again) from there.
func TestXDSReplicasBehindOneAddress(t *testing.T) {
	const ns = "xds-replicas"
	r1, r2, calls, backends := replicasBehindProxy(t, ns, "replicas")
	killed := time.Now()
	r1.kill(t)
	r2.waitClient(t)
	t.Logf("reconnected to the other replica %v after the kill", time.Since(killed).Round(time.Millisecond))
	calls.waitWindow(t, "calls reach both pods after the kill", replicasTarget, backends...)
	followedWithoutFailure(t, ns, calls, backends)
}

// replicasBehindProxy starts two replicas of one config behind one
// address (a replicaProxy) and a continuous caller of replicasTarget
// (node id node) through it, and waits until its calls reach both pods
// through the first replica. It skips t where no EndpointSlice can
// point at this host.
func replicasBehindProxy(t *testing.T, ns, node string) (r1, r2 *replica, calls *xdsCalls, backends []string) {
	t.Helper()
	testenv.Need(t, env)
	ip := localIPv4()
	if ip == "" {
		t.Skip("no IPv4 address but loopback: an EndpointSlice may not point at 127.0.0.1")
	}
	backends, config := xdsFixture(t, ns, ip, 2)
	kubeconfig := env.WriteKubeconfig(t, "")
	r1 = startReplica(t, config, kubeconfig, testenv.FreeAddr(t), testenv.FreeAddr(t))
	r2 = startReplica(t, config, kubeconfig, testenv.FreeAddr(t), testenv.FreeAddr(t))
	proxy := newReplicaProxy(t, r1.xds, r2.xds)
	calls = startXDSCalls(t, xdsBootstrap(node, proxy.addr()), replicasTarget)
	calls.waitWindow(t, "calls reach both pods", replicasTarget, backends...)
	if c1, c2 := r1.clients(t), r2.clients(t); c1 != "1" || c2 != "0" {
		t.Fatalf("xDS clients of the replicas: %s and %s, want 1 and 0 (the proxy's first)", c1, c2)
	}
	return r1, r2, calls, backends
}

// waitClient waits until the replica has the one xDS client.
func (r *replica) waitClient(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, "the client connected to the other replica", func() string {
		if c := r.clients(t); c != "1" {
			return "metasync_xds_clients " + c
		}
		return ""
	})
}

// followedWithoutFailure deletes a slice of ns and creates it again:
// the caller follows both (through the replica it is on now), and none
// of its calls failed after its first answered one.
func followedWithoutFailure(t *testing.T, ns string, calls *xdsCalls, backends []string) {
	t.Helper()
	restore := sliceAway(t, ns, "xds-app-1")
	took := calls.waitWindow(t, "a deleted slice's pod gets no call, through the other replica", replicasTarget, backends[0])
	t.Logf("the deleted slice followed within %v", took.Round(time.Millisecond))
	restore()
	took = calls.waitWindow(t, "a slice created again gets calls, through the other replica", replicasTarget, backends...)
	t.Logf("the created slice followed within %v", took.Round(time.Millisecond))
	got := calls.stop(t).Targets[replicasTarget]
	if got.failed() != 0 {
		t.Errorf("calls failed after the first answered one: %v", got.Failed)
	}
	t.Logf("calls: %v answered, first after %v, %v before it", got.Answered, got.First.Round(time.Millisecond), got.Waiting)
}

// TestXDSFallback: a bootstrap naming two xds_servers (gRFC A71
// fallback, on in grpc-go with no setting), each a replica. grpc-go
// (1.85) keeps an xDS client per target, each with its own connections.
//
//   - The first is down when the client starts: it calls through the
//     second, and follows changes there. When the first comes up, the
//     client goes back to it, but asks it for the Listener only: the
//     route, Cluster and assignment it had asked of the second are asked
//     of no server any more, and it follows no change of them.
//   - The client has started on the first, which is then killed: it
//     keeps calling on what it has, without a failed call, and does not
//     fall back (it has every resource it asked for), so it follows no
//     change; a target it starts calling meanwhile (an xDS client of its
//     own) calls through the second. When the first is back, the client
//     gets everything from it again, and follows the change.
func TestXDSFallback(t *testing.T) {
	testenv.Need(t, env)
	ip := localIPv4()
	if ip == "" {
		t.Skip("no IPv4 address but loopback: an EndpointSlice may not point at 127.0.0.1")
	}
	const ns = "xds-fallback"
	backends, config := xdsFixture(t, ns, ip, 2)
	// A second model of the same app: a target the client calls later.
	app := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "iidp.com/v1", "kind": "AppModel",
		"metadata": map[string]any{"name": "xds-app", "namespace": ns, "labels": map[string]any{"iidp": "iidp"}},
		"spec":     map[string]any{"type": "model", "version": "1", "models": []any{"xds-model", "xds-model-b"}},
	}}
	if err := kubeapply.Apply(context.Background(), env.Config, app); err != nil {
		t.Fatal(err)
	}
	const targetB = "chains/model-to-endpoints/xds-model-b"
	kubeconfig := env.WriteKubeconfig(t, "")

	t.Run("first down at start", func(t *testing.T) {
		primary := testenv.FreeAddr(t) // nothing listens there yet
		r2 := startReplica(t, config, kubeconfig, testenv.FreeAddr(t), testenv.FreeAddr(t))
		calls := startXDSCalls(t, xdsBootstrap("fallback-1", primary, r2.xds), replicasTarget)
		calls.waitWindow(t, "calls reach both pods through the second server", replicasTarget, backends...)
		if c := r2.clients(t); c != "1" {
			t.Fatalf("the second server's xDS clients: %s, want 1", c)
		}
		restore := sliceAway(t, ns, "xds-app-1")
		took := calls.waitWindow(t, "a deleted slice's pod gets no call, through the second server", replicasTarget, backends[0])
		t.Logf("the deleted slice followed within %v through the second server", took.Round(time.Millisecond))

		up := time.Now()
		r1 := startReplica(t, config, kubeconfig, testenv.FreeAddr(t), primary)
		testenv.Eventually(t, "the client back on the first server", func() string {
			if c1, c2 := r1.clients(t), r2.clients(t); c1 != "1" || c2 != "0" {
				return fmt.Sprintf("xDS clients %s and %s", c1, c2)
			}
			return ""
		})
		t.Logf("back on the first server %v after it started", time.Since(up).Round(time.Millisecond))
		// What docs/xds.md says of grpc-go: if this changes, change it there.
		if types := r1.followed(t); !slices.Equal(types, []string{"listener"}) {
			t.Errorf("the client asks the first server for %v once back on it; grpc-go 1.85 asks for the listener only", types)
		}
		restore()
		r1.answers(t, "xds-model", backends...)
		for hold := time.Now().Add(2 * time.Second); time.Now().Before(hold); {
			if got := calls.window(replicasTarget); got["failed"] > 0 || got[backends[1]] > 0 || got[backends[0]] == 0 {
				t.Errorf("calls once back on the first server, after a slice was created again: %v; grpc-go 1.85 follows no change there", got)
				break
			}
		}

		got := calls.stop(t).Targets[replicasTarget]
		if got.failed() != 0 {
			t.Errorf("calls failed after the first answered one: %v", got.Failed)
		}
		t.Logf("calls: %v answered, first after %v, %v before it", got.Answered, got.First.Round(time.Millisecond), got.Waiting)
	})

	t.Run("first killed", func(t *testing.T) {
		r1 := startReplica(t, config, kubeconfig, testenv.FreeAddr(t), testenv.FreeAddr(t))
		r2 := startReplica(t, config, kubeconfig, testenv.FreeAddr(t), testenv.FreeAddr(t))
		calls := startXDSCalls(t, xdsBootstrap("fallback-2", r1.xds, r2.xds), replicasTarget)
		calls.waitWindow(t, "calls reach both pods through the first server", replicasTarget, backends...)
		if c1, c2 := r1.clients(t), r2.clients(t); c1 != "1" || c2 != "0" {
			t.Fatalf("xDS clients of the servers: %s and %s, want 1 and 0", c1, c2)
		}

		r1.kill(t)
		restore := sliceAway(t, ns, "xds-app-1")
		r2.answers(t, "xds-model", backends[0])
		// The client keeps what it has: calls go on to both pods, the
		// deleted slice's too, and it is no client of the second server.
		for hold := time.Now().Add(2 * time.Second); time.Now().Before(hold); {
			if got := calls.window(replicasTarget); got["failed"] > 0 || got[backends[1]] == 0 {
				t.Fatalf("calls after the first server was killed: %v, want both pods and no failure (the resources the client has)", got)
			}
		}
		if c := r2.clients(t); c != "0" {
			t.Fatalf("the second server's xDS clients: %s, want 0 (grpc-go falls back only for a resource it has not got)", c)
		}

		calls.also(t, targetB)
		testenv.Eventually(t, "a new target's calls answered, through the second server", func() string {
			if got := calls.target(targetB); len(got.Answered) == 0 {
				return fmt.Sprint(got.Waiting)
			}
			return ""
		})
		if c := r2.clients(t); c != "1" {
			t.Fatalf("the second server's xDS clients: %s, want 1 (the new target's)", c)
		}

		back := time.Now()
		startReplica(t, config, kubeconfig, testenv.FreeAddr(t), r1.xds)
		calls.waitWindow(t, "the deleted slice's pod gets no call, once the first server is back", replicasTarget, backends[0])
		t.Logf("the deleted slice followed %v after the first server started again", time.Since(back).Round(time.Millisecond))
		restore()

		got := calls.stop(t)
		if n := got.Targets[replicasTarget].failed(); n != 0 {
			t.Errorf("calls failed after the first answered one: %v", got.Targets[replicasTarget].Failed)
		}
		t.Logf("calls: %s", got)
	})
}

// TestXDSReplicaNotSyncedSendsNoAssignment: a replica that has not
// listed its resources (its apiserver cannot be reached) serves a client
// the Listener, route and Cluster of its target, never an assignment:
// the client waits (no call fails UNAVAILABLE, as an empty assignment
// would make it), and calls once the replica has listed. Its stream is
// up, so grpc-go does not fall back to the second server its bootstrap
// names, a replica that has listed.
func TestXDSReplicaNotSyncedSendsNoAssignment(t *testing.T) {
	testenv.Need(t, env)
	ip := localIPv4()
	if ip == "" {
		t.Skip("no IPv4 address but loopback: an EndpointSlice may not point at 127.0.0.1")
	}
	backends, config := xdsFixture(t, "xds-unsynced", ip, 1)
	apiAddr := testenv.FreeAddr(t) // nothing there until the proxy below
	r := startReplica(t, config, env.WriteKubeconfig(t, apiAddr), testenv.FreeAddr(t), testenv.FreeAddr(t))
	synced := startReplica(t, config, env.WriteKubeconfig(t, ""), testenv.FreeAddr(t), testenv.FreeAddr(t))
	calls := startXDSCalls(t, xdsBootstrap("unsynced", r.xds, synced.xds), replicasTarget)

	asked := func() string {
		var clients struct {
			Clients []struct {
				Types map[string]struct {
					Names []string `json:"names"`
					Sent  string   `json:"sent"`
				} `json:"types"`
			} `json:"clients"`
		}
		a := call(t, "GET", base(r.http)+"/v1/xds/clients")
		if err := json.Unmarshal([]byte(a.raw), &clients); err != nil || len(clients.Clients) != 1 {
			return a.raw
		}
		types := clients.Clients[0].Types
		if !slices.Contains(types["endpoint"].Names, replicasTarget) || types["cluster"].Sent == "" {
			return a.raw
		}
		if types["endpoint"].Sent != "" {
			t.Fatalf("an assignment sent before the first list: %s", a.raw)
		}
		return ""
	}
	testenv.Eventually(t, "the client asks for the assignment, and has the Cluster", asked)
	time.Sleep(2 * time.Second)
	if msg := asked(); msg != "" {
		t.Fatalf("2 s later: %s", msg)
	}
	if a := call(t, "GET", base(r.http)+"/readyz"); a.code != 503 {
		t.Fatalf("/readyz %d %s, want 503 before the first list", a.code, a.raw)
	}
	if c := synced.clients(t); c != "0" {
		t.Errorf("the second server's xDS clients: %s, want 0 (no fallback while the first server's stream is up)", c)
	}
	got := calls.target(replicasTarget)
	if len(got.Answered) != 0 {
		t.Fatalf("calls answered before the first list: %v", got.Answered)
	}
	for k := range got.Waiting {
		if strings.HasPrefix(k, "Unavailable") {
			t.Errorf("a call failed %q before the first list: the client should wait", k)
		}
	}
	t.Logf("calls before the first list: %v", got.Waiting)

	target := strings.TrimSuffix(strings.TrimPrefix(env.Config.Host, "https://"), "/")
	proxy, err := testenv.NewProxy(apiAddr, target)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	reachable := time.Now()
	calls.waitWindow(t, "calls reach the pod once listed", replicasTarget, backends[0])
	t.Logf("calls answered %v after the apiserver could be reached", time.Since(reachable).Round(time.Millisecond))
	if c1, c2 := r.clients(t), synced.clients(t); c1 != "1" || c2 != "0" {
		t.Errorf("xDS clients of the servers: %s and %s, want 1 and 0", c1, c2)
	}
}

// TestXDSReplicaShutdown: a replica behind one address that is stopped
// with SIGTERM ends its ADS streams UNAVAILABLE after a GOAWAY: its
// client connects to the other replica at once, without a failed call,
// and follows changes there.
func TestXDSReplicaShutdown(t *testing.T) {
	const ns = "xds-shutdown"
	r1, r2, calls, backends := replicasBehindProxy(t, ns, "shutdown")
	stopped := time.Now()
	if err := r1.d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r2.waitClient(t)
	t.Logf("reconnected to the other replica %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	select {
	case <-r1.d.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the replica did not exit within 15 s of SIGTERM")
	}
	if r1.d.err != nil {
		t.Errorf("the replica stopped with SIGTERM exited: %v", r1.d.err)
	}
	t.Logf("the replica exited %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	if log := r1.d.stderr.String(); strings.Contains(log, "xDS drain incomplete") {
		t.Errorf("the replica's xDS drain was incomplete:\n%s", log)
	}
	followedWithoutFailure(t, ns, calls, backends)
}
