package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/internal/kubeapply"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// ep is one endpoint of a crafted EndpointSlice: conditions nil leaves
// them out; a nil condition is unset.
type ep struct {
	addr                      string
	noConditions              bool
	ready, serving, terminate *bool
}

var yes, no = ptr(true), ptr(false)

func ptr[T any](v T) *T { return &v }

// applySlice writes the EndpointSlice name of service svc, with one port
// named http of number port (none when 0), by server-side apply.
func applySlice(t *testing.T, ns, name, svc string, port int, eps ...ep) {
	t.Helper()
	endpoints := []map[string]any{}
	for _, e := range eps {
		m := map[string]any{"addresses": []string{e.addr}}
		if !e.noConditions {
			c := map[string]any{}
			for k, v := range map[string]*bool{"ready": e.ready, "serving": e.serving, "terminating": e.terminate} {
				if v != nil {
					c[k] = *v
				}
			}
			m["conditions"] = c
		}
		endpoints = append(endpoints, m)
	}
	obj := map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata":    map[string]any{"name": name, "labels": map[string]any{"kubernetes.io/service-name": svc}},
		"addressType": "IPv4", "endpoints": endpoints,
	}
	if port != 0 {
		obj["ports"] = []map[string]any{{"name": "http", "port": port, "protocol": "TCP"}}
	}
	body, _ := json.Marshal(obj)
	force := true
	if _, err := env.Dynamic.Resource(sliceGVR).Namespace(ns).Patch(context.Background(), name, "application/apply-patch+yaml", body,
		metav1.PatchOptions{FieldManager: kubeapply.FieldManager, Force: &force}); err != nil {
		t.Fatal(err)
	}
}

// TestEndpointSliceSemantics: the reference setup answers what kube-proxy
// would route to, over crafted slices: ready true or unset (also with no
// conditions), a service's serving terminating endpoints when it has no
// ready one (across its slices), an endpoint of two slices once, and
// IP:PORT with each slice's own port number.
func TestEndpointSliceSemantics(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "slice-semantics"
	env.Namespace(t, ns)
	for app, model := range map[string]string{"svc": "m-svc", "rollout": "m-rollout", "term": "m-term", "mixed": "m-mixed"} {
		apply(t, ns, app, iidp, model)
	}
	// ready: true, unset, no conditions; not ready; one in both slices.
	applySlice(t, ns, "svc-a", "svc", 8080,
		ep{addr: "10.1.0.1", ready: yes}, ep{addr: "10.1.0.2"}, ep{addr: "10.1.0.3", noConditions: true},
		ep{addr: "10.1.0.4", ready: no, serving: no})
	applySlice(t, ns, "svc-b", "svc", 8080, ep{addr: "10.1.0.1", ready: yes, serving: yes, terminate: no})
	// A rollout that changes the port's number: two slices, two numbers.
	applySlice(t, ns, "rollout-a", "rollout", 8080, ep{addr: "10.2.0.1", ready: yes})
	applySlice(t, ns, "rollout-b", "rollout", 9090, ep{addr: "10.2.0.2", ready: yes})
	// Every endpoint terminating: the serving ones answer.
	applySlice(t, ns, "term-a", "term", 8080,
		ep{addr: "10.3.0.1", ready: no, serving: yes, terminate: yes},
		ep{addr: "10.3.0.2", ready: no, serving: no, terminate: yes},
		ep{addr: "10.3.0.3", ready: no, terminate: yes}) // serving unset: serving
	// One slice terminating, another ready: the ready one only.
	applySlice(t, ns, "mixed-a", "mixed", 8080, ep{addr: "10.4.0.1", ready: no, serving: yes, terminate: yes})
	applySlice(t, ns, "mixed-b", "mixed", 8080, ep{addr: "10.4.0.2", ready: yes})
	// A slice without ports: bare addresses only.
	applySlice(t, ns, "svc-c", "svc", 0, ep{addr: "10.1.0.9", ready: yes})

	e := startEngine(t, exampleConfig(t, ns))
	for _, c := range []struct {
		model           string
		addrs, hostport []string
	}{
		{"m-svc", []string{"10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.9"}, []string{"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"}},
		{"m-rollout", []string{"10.2.0.1", "10.2.0.2"}, []string{"10.2.0.1:8080", "10.2.0.2:9090"}},
		{"m-term", []string{"10.3.0.1", "10.3.0.3"}, []string{"10.3.0.1:8080", "10.3.0.3:8080"}},
		{"m-mixed", []string{"10.4.0.2"}, []string{"10.4.0.2:8080"}},
	} {
		expectChain(t, e, "model-to-addresses", c.model, c.addrs...)
		expectChain(t, e, "model-to-endpoints", c.model, c.hostport...)
	}
	// The lookup of the service, and its keys, are the index's: no
	// second index shows.
	expect(t, e, "service-to-addresses", "mixed", "10.4.0.2")
	if keys := e.Keys("service-to-addresses"); !slices.Equal(keys, []string{"mixed", "rollout", "svc", "term"}) {
		t.Errorf("keys %q", keys)
	}
	for _, ix := range e.Indexes() {
		if ix.Name != "model-to-app" && ix.Name != "service-to-addresses" && ix.Name != "service-to-endpoints" {
			t.Errorf("index %q listed", ix.Name)
		}
	}

	// The ready slice of "mixed" goes: its terminating endpoint answers.
	remove(t, sliceGVR, ns, "mixed-b")
	expectChain(t, e, "model-to-endpoints", "m-mixed", "10.4.0.1:8080")
	// It stops serving: nothing.
	applySlice(t, ns, "mixed-a", "mixed", 8080, ep{addr: "10.4.0.1", ready: no, serving: no, terminate: yes})
	expectChain(t, e, "model-to-addresses", "m-mixed")
	// A new pod is ready: the answer is it alone.
	applySlice(t, ns, "mixed-b", "mixed", 8080, ep{addr: "10.4.0.3"})
	expectChain(t, e, "model-to-addresses", "m-mixed", "10.4.0.3")
	// One of the two slices of 10.1.0.1 goes: it stays through the other.
	remove(t, sliceGVR, ns, "svc-b")
	expectChain(t, e, "model-to-endpoints", "m-svc", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")
}

// hostIP returns an IPv4 address of this machine that an EndpointSlice
// accepts (not loopback), or skips the test.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("no IPv4 address beside loopback")
	return ""
}

// TestMakeBeforeBreak: as the pods of a service terminate one by one, the
// chain's stream never answers empty while a pod can serve, and gRPC calls
// through the resolver, on IP:PORT from the slices (no ?port), never fail
// until no pod serves.
func TestMakeBeforeBreak(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "make-before-break"
	env.Namespace(t, ns)
	ip := hostIP(t)
	// Two "pods": one IP, two ports, each in a slice of its own.
	var ports [2]int
	var calls [2]atomic.Int64
	for i := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Skipf("listen on %s: %v", ip, err)
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			calls[i].Add(1)
			return h(ctx, req)
		}))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(srv.Stop)
	}
	pod := func(i int) string { return net.JoinHostPort(ip, fmt.Sprint(ports[i])) }
	apply(t, ns, "roll", iidp, "model1")
	applySlice(t, ns, "roll-0", "roll", ports[0], ep{addr: ip, ready: yes})
	applySlice(t, ns, "roll-1", "roll", ports[1], ep{addr: ip, ready: yes})

	e := startEngine(t, exampleConfig(t, ns))
	expectChain(t, e, "model-to-endpoints", "model1", slices.Sorted(slices.Values([]string{pod(0), pod(1)}))...)

	// The stream of the chain key, every answer recorded.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := e.Subscribe(ctx, msync.Target{Chain: "model-to-endpoints", Key: "model1"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var answers [][]string
	go func() {
		for {
			ev, err := sub.Next(ctx)
			if err != nil {
				return
			}
			if ev.Type == msync.EventSnapshot || ev.Type == msync.EventUpdate {
				mu.Lock()
				answers = append(answers, slices.Clone(ev.Values))
				mu.Unlock()
			}
		}
	}()

	conn, err := grpc.NewClient("metasync:///chains/model-to-endpoints/model1",
		grpc.WithResolvers(grpcresolver.NewBuilder(e)),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	// Calls all along, each failure kept.
	var failures atomic.Int64
	var lastFailure atomic.Value
	stop := make(chan struct{})
	done := make(chan struct{})
	testenv.Eventually(t, "calls succeed", func() string {
		if err := call(); err != nil {
			return err.Error()
		}
		return ""
	})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := call(); err != nil {
				failures.Add(1)
				lastFailure.Store(err.Error())
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	gets := func(want ...int) {
		t.Helper()
		testenv.Eventually(t, fmt.Sprintf("calls reach exactly pods %v", want), func() string {
			var before [2]int64
			for i := range calls {
				before[i] = calls[i].Load()
			}
			time.Sleep(300 * time.Millisecond)
			var got []int
			for i := range calls {
				if calls[i].Load() > before[i] {
					got = append(got, i)
				}
			}
			if slices.Equal(got, want) {
				return ""
			}
			return fmt.Sprint(got)
		})
	}
	gets(0, 1)
	// Pod 0 terminates: pod 1 alone.
	applySlice(t, ns, "roll-0", "roll", ports[0], ep{addr: ip, ready: no, serving: yes, terminate: yes})
	expectChain(t, e, "model-to-endpoints", "model1", pod(1))
	gets(1)
	// Pod 1 terminates too (a scale to zero): both still serve, both answer.
	applySlice(t, ns, "roll-1", "roll", ports[1], ep{addr: ip, ready: no, serving: yes, terminate: yes})
	expectChain(t, e, "model-to-endpoints", "model1", slices.Sorted(slices.Values([]string{pod(0), pod(1)}))...)
	gets(0, 1)
	// Pod 0 is gone.
	remove(t, sliceGVR, ns, "roll-0")
	expectChain(t, e, "model-to-endpoints", "model1", pod(1))
	gets(1)
	close(stop)
	<-done
	if n := failures.Load(); n > 0 {
		t.Errorf("%d calls failed while a pod served; the last: %v", n, lastFailure.Load())
	}
	mu.Lock()
	for i, a := range answers {
		if len(a) == 0 {
			t.Errorf("answer %d of the stream is empty while a pod serves: %q", i, answers)
		}
	}
	mu.Unlock()

	// Pod 1 stops serving: now, and only now, nothing.
	applySlice(t, ns, "roll-1", "roll", ports[1], ep{addr: ip, ready: no, serving: no, terminate: yes})
	expectChain(t, e, "model-to-endpoints", "model1")
	testenv.Eventually(t, "the stream answers empty", func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(answers) > 0 && len(answers[len(answers)-1]) == 0 {
			return ""
		}
		return fmt.Sprint(answers)
	})
}

// applyHintedSlice writes a slice of service svc whose endpoints carry
// hints: zones[i] lists the zones hinted for endpoint i (nil: no hints).
func applyHintedSlice(t *testing.T, ns, name, svc string, port int, addrs []string, zones [][]string, nodes []string) {
	t.Helper()
	endpoints := []map[string]any{}
	for i, a := range addrs {
		m := map[string]any{"addresses": []string{a}, "conditions": map[string]any{"ready": true}}
		hints := map[string]any{}
		if zones[i] != nil {
			var fz []map[string]string
			for _, z := range zones[i] {
				fz = append(fz, map[string]string{"name": z})
			}
			hints["forZones"] = fz
		}
		if nodes != nil && nodes[i] != "" {
			hints["forNodes"] = []map[string]string{{"name": nodes[i]}}
		}
		if len(hints) > 0 {
			m["hints"] = hints
		}
		endpoints = append(endpoints, m)
	}
	obj := map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata":    map[string]any{"name": name, "labels": map[string]any{"kubernetes.io/service-name": svc}},
		"addressType": "IPv4", "endpoints": endpoints,
		"ports": []map[string]any{{"name": "http", "port": port}},
	}
	body, _ := json.Marshal(obj)
	force := true
	if _, err := env.Dynamic.Resource(sliceGVR).Namespace(ns).Patch(context.Background(), name, "application/apply-patch+yaml", body,
		metav1.PatchOptions{FieldManager: kubeapply.FieldManager, Force: &force}); err != nil {
		t.Fatal(err)
	}
}

// TestTopologyAwareAnswers: a caller that says where it runs gets what
// kube-proxy would route it to: the endpoints hinted for its zone (or
// node) when every endpoint is hinted and some are for it, every endpoint
// otherwise; a caller that says nothing gets every endpoint. In process,
// over HTTP (lookups, chains, streams) and as hints change.
func TestTopologyAwareAnswers(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "topology"
	env.Namespace(t, ns)
	apply(t, ns, "hinted", iidp, "m-hinted")
	apply(t, ns, "partly", iidp, "m-partly")
	// Every endpoint hinted: a and b each have one, c has one hinted for
	// both c and a (as the controller spreads capacity), d has none.
	applyHintedSlice(t, ns, "hinted-1", "hinted", 8080,
		[]string{"10.5.0.1", "10.5.0.2", "10.5.0.3"}, [][]string{{"a"}, {"b"}, {"a", "c"}}, []string{"n1", "", ""})
	// One endpoint without hints: hints are ignored.
	applyHintedSlice(t, ns, "partly-1", "partly", 8080,
		[]string{"10.6.0.1", "10.6.0.2"}, [][]string{{"a"}, nil}, nil)
	e := startEngine(t, exampleConfig(t, ns))
	expectChain(t, e, "model-to-endpoints", "m-hinted", "10.5.0.1:8080", "10.5.0.2:8080", "10.5.0.3:8080")

	at := func(zone, node string) msync.Locality { return msync.Locality{Zone: zone, Node: node} }
	for _, c := range []struct {
		model string
		at    msync.Locality
		want  []string
	}{
		{"m-hinted", at("a", ""), []string{"10.5.0.1:8080", "10.5.0.3:8080"}},
		{"m-hinted", at("b", ""), []string{"10.5.0.2:8080"}},
		{"m-hinted", at("c", ""), []string{"10.5.0.3:8080"}},
		{"m-hinted", at("d", ""), []string{"10.5.0.1:8080", "10.5.0.2:8080", "10.5.0.3:8080"}}, // none for d
		{"m-hinted", at("", ""), []string{"10.5.0.1:8080", "10.5.0.2:8080", "10.5.0.3:8080"}},
		// Node hints: only one endpoint carries one, so they do not
		// apply; the zone's do.
		{"m-hinted", at("b", "n1"), []string{"10.5.0.2:8080"}},
		{"m-partly", at("a", ""), []string{"10.6.0.1:8080", "10.6.0.2:8080"}},
	} {
		if got := e.ResolveAt("model-to-endpoints", c.model, c.at); !slices.Equal(got, c.want) {
			t.Errorf("%s at %+v = %q, want %q", c.model, c.at, got, c.want)
		}
	}
	if got := e.LookupAt("service-to-addresses", "hinted", at("b", "")); !slices.Equal(got, []string{"10.5.0.2"}) {
		t.Errorf("service-to-addresses hinted at b = %q", got)
	}
	// Over HTTP (?zone=, the hidden hints index, bad zones): the daemon's
	// TestDaemonExplainsAndNarrows in cmd/metasync.

	// A stream of a caller in zone b follows the hints as they change.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := e.Subscribe(ctx, msync.Target{Chain: "model-to-endpoints", Key: "m-hinted", At: at("b", "")})
	if err != nil {
		t.Fatal(err)
	}
	next := func(want ...string) {
		t.Helper()
		for {
			nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
			ev, err := sub.Next(nctx)
			ncancel()
			if err != nil {
				t.Fatalf("waiting for %q: %v", want, err)
			}
			if ev.Type != msync.EventSnapshot && ev.Type != msync.EventUpdate {
				continue
			}
			if slices.Equal(ev.Values, want) {
				return
			}
			t.Logf("stream: %s %q", ev.Type, ev.Values)
		}
	}
	next("10.5.0.2:8080")
	// The controller drops the hints (too few endpoints per zone): all.
	applyHintedSlice(t, ns, "hinted-1", "hinted", 8080,
		[]string{"10.5.0.1", "10.5.0.2", "10.5.0.3"}, [][]string{nil, nil, nil}, nil)
	next("10.5.0.1:8080", "10.5.0.2:8080", "10.5.0.3:8080")
	// Hints again, zone b now served by .3.
	applyHintedSlice(t, ns, "hinted-1", "hinted", 8080,
		[]string{"10.5.0.1", "10.5.0.2", "10.5.0.3"}, [][]string{{"a"}, {"a"}, {"b"}}, nil)
	next("10.5.0.3:8080")
	// Every node hinted: a caller on n2 gets its node's endpoint.
	applyHintedSlice(t, ns, "hinted-1", "hinted", 8080,
		[]string{"10.5.0.1", "10.5.0.2", "10.5.0.3"}, [][]string{{"a"}, {"a"}, {"b"}}, []string{"n1", "n2", "n3"})
	expectResolveAt(t, e, "m-hinted", at("b", "n2"), "10.5.0.2:8080")
	expectResolveAt(t, e, "m-hinted", at("b", "n9"), "10.5.0.3:8080")
}

func expectResolveAt(t *testing.T, e *msync.Engine, key string, at msync.Locality, want ...string) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("ResolveAt(%q, %+v) = %q", key, at, want), func() string {
		if got := e.ResolveAt("model-to-endpoints", key, at); !slices.Equal(got, want) {
			return fmt.Sprintf("%q", got)
		}
		return ""
	})
}
