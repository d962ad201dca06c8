package integration_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcstatus "google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/iidp/metasync/grpcresolver"
	mschema "github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/test/testenv"
)

// podServer is a gRPC server on one loopback address (127.0.0.x), as a
// pod's IP, counting its calls.
type podServer struct {
	ip    string
	calls atomic.Int64
}

// TestGRPCResolverOnTheControlPlane: Backends (a CRD) on a real apiserver
// hold their servers' host:port addresses, AppModels map models to them
// (an EndpointSlice refuses the loopback addresses of the test servers;
// bare hosts with ?port= are tested in package grpcresolver). Three servers
// behind model1 under round_robin all get calls; one leaving the slice
// stops getting calls within a second; one joining gets calls; an empty
// slice fails calls with UNAVAILABLE within a second; one back serves
// again; the model moving to another app moves the calls.
func TestGRPCResolverOnTheControlPlane(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "grpc-resolver"
	env.Namespace(t, ns)

	// One port on 127.0.0.1-5: five "pods" that differ by IP only.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(probe.Addr().String())
	probe.Close()
	pods := map[string]*podServer{}
	for i := 1; i <= 5; i++ {
		p := &podServer{ip: "127.0.0." + strconv.Itoa(i)}
		ln, err := net.Listen("tcp", net.JoinHostPort(p.ip, port))
		if err != nil {
			t.Skipf("cannot listen on %s:%s: %v", p.ip, port, err)
		}
		srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			p.calls.Add(1)
			return h(ctx, req)
		}))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(srv.Stop)
		pods[p.ip] = p
	}

	apply(t, ns, "base", iidp, "model1")
	env.InstallCRD(t, testenv.LooseCRD("test.iidp.com", "Backend", "backends"))
	backendGVR := schema.GroupVersionResource{Group: "test.iidp.com", Version: "v1", Resource: "backends"}
	// slice sets the servers of one part of an app, as an EndpointSlice
	// of its Service would.
	slice := func(name, app string, ips ...string) {
		t.Helper()
		addrs := []any{}
		for _, ip := range ips {
			addrs = append(addrs, net.JoinHostPort(ip, port))
		}
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "test.iidp.com/v1", "kind": "Backend",
			"metadata": map[string]any{"name": name, "labels": map[string]any{"app": app}},
			"spec":     map[string]any{"addresses": addrs},
		}}
		if _, err := env.Dynamic.Resource(backendGVR).Namespace(ns).Apply(context.Background(), name, obj, metav1.ApplyOptions{FieldManager: "grpc-test", Force: true}); err != nil {
			t.Fatal(err)
		}
	}
	slice("base-a", "base", "127.0.0.1", "127.0.0.2")
	slice("base-b", "base", "127.0.0.3")

	cfg := &mschema.Config{
		Resources: []mschema.Resource{
			seedConfig(ns).Resources[0],
			{Name: "backends", Group: "test.iidp.com", Version: "v1", Resource: "backends", Namespace: ns,
				Indexes: []mschema.Index{{Name: "app-to-addresses", Key: "metadata.labels.app", Value: "spec.addresses"}}},
		},
		Chains: []mschema.Chain{{Name: "model-to-addresses", Indexes: []string{"model-to-app", "app-to-addresses"}}},
	}
	e := startEngine(t, cfg)
	conn, err := grpc.NewClient("metasync:///chains/model-to-addresses/model1",
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
	spread := func(n int) map[string]int64 {
		before := map[string]int64{}
		for ip, p := range pods {
			before[ip] = p.calls.Load()
		}
		for range n {
			if err := call(); err != nil {
				t.Fatalf("call: %v", err)
			}
		}
		out := map[string]int64{}
		for ip, p := range pods {
			if d := p.calls.Load() - before[ip]; d > 0 {
				out[ip] = d
			}
		}
		return out
	}
	within := func(d time.Duration, what string, cond func() bool) {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > d {
				t.Fatalf("%s: not within %v", what, d)
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%s: %v", what, time.Since(start).Round(time.Millisecond))
	}
	keys := func(m map[string]int64) string {
		return fmt.Sprint(len(m), m["127.0.0.1"] > 0, m["127.0.0.2"] > 0, m["127.0.0.3"] > 0)
	}

	within(10*time.Second, "all three servers get calls", func() bool { return keys(spread(30)) == "3 true true true" })
	slice("base-a", "base", "127.0.0.1") // 127.0.0.2 leaves
	within(time.Second, "a server that leaves the slice gets no more calls", func() bool {
		got := spread(30)
		return got["127.0.0.2"] == 0
	})
	slice("base-b", "base", "127.0.0.3", "127.0.0.4") // 127.0.0.4 joins
	within(time.Second, "a server that joins gets calls", func() bool { return spread(30)["127.0.0.4"] > 0 })
	slice("base-a", "base")
	slice("base-b", "base")
	within(time.Second, "an empty answer fails calls with UNAVAILABLE", func() bool { return grpcstatus.Code(call()) == codes.Unavailable })
	slice("base-b", "base", "127.0.0.2")
	within(time.Second, "one back: calls succeed", func() bool { return call() == nil })

	// The chain follows every step: model1 moves to app "other".
	slice("other-a", "other", "127.0.0.5")
	apply(t, ns, "other", iidp, "model1")
	apply(t, ns, "base", iidp, "model2")
	within(time.Second, "the model moves: calls go to the other app's server", func() bool {
		got := spread(20)
		return len(got) == 1 && got["127.0.0.5"] == 20
	})
}
