package main_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/test/testenv"
)

// TestXDSHomeClusterFirst: the daemon reads two control planes, east
// (home) and west, each with an EndpointSlice of service shop pointing
// at a gRPC server of its own; grpc-go's xDS client calls east's backend
// only (priority 0). East's endpoint not ready: calls go to west's
// (priority 1, grpc-go's failover); ready again: calls come back to
// east. A reload makes west the home: calls go to west's; another
// removes west: calls go to east's. A caller calling all along sees no
// call fail.
func TestXDSHomeClusterFirst(t *testing.T) {
	testenv.Need(t, env)
	ip := localIPv4()
	if ip == "" {
		t.Skip("no IPv4 address but loopback: an EndpointSlice may not point at 127.0.0.1")
	}
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	const ns = "xds-home-first"
	env.Namespace(t, ns)
	west.Namespace(t, ns)
	home, other := healthBackend(t, ip), healthBackend(t, ip)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := env.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, shopSlice(ip, home, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := west.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, shopSlice(ip, other, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setReady := func(ready bool) {
		t.Helper()
		s, err := env.Kube.DiscoveryV1().EndpointSlices(ns).Get(ctx, "shop-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Endpoints[0].Conditions.Ready = &ready
		if _, err := env.Kube.DiscoveryV1().EndpointSlices(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	addr, xdsAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	config := filepath.Join(t.TempDir(), "config.yaml")
	westKubeconfig, eastKubeconfig := west.WriteKubeconfig(t, ""), env.WriteKubeconfig(t, "")
	body := homeFirstConfig(westKubeconfig, ns)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, nil, "--config", config, "--kubeconfig", eastKubeconfig, "--listen", addr, "--xds-listen", xdsAddr)
	waitHTTP(t, d, addr)

	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"home-first","locality":{"zone":"z"}}}`, xdsAddr)
	builder, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///indexes/service-to-endpoints/shop", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(builder))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// From the first switch on, no call may fail: these nor those of a
	// caller calling all along.
	c := &homeFirstCalls{ctx: ctx, h: healthpb.NewHealthClient(conn)}
	only := func(what, want string) {
		t.Helper()
		c.only(t, what, want)
	}
	only("calls go to the home cluster's backend", home)

	c.counting.Store(true)
	c.done.Store(0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.callAllAlong(stop)
	}()
	setReady(false)
	only("calls fail over to the other cluster's backend", other)
	setReady(true)
	only("calls come back to the home cluster", home)

	// A reload makes west the home (east now read through a kubeconfig
	// of its own): calls go to west's backend, and none fails meanwhile.
	_, resources, _ := strings.Cut(body, "resources:")
	body = fmt.Sprintf("clusters:\n  - name: east\n    kubeconfig: %s\n  - name: west\n    kubeconfig: %s\n    home: true\nresources:%s",
		eastKubeconfig, westKubeconfig, resources)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	only("calls go to the new home's backend after the reload", other)

	// A reload removes west, the home: east's backend takes the calls,
	// none failing (the assignments are never emptied meanwhile).
	body = fmt.Sprintf("clusters:\n  - name: east\n    kubeconfig: %s\nresources:%s", eastKubeconfig, resources)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	only("calls go to east's backend once the home is removed", home)
	close(stop)
	wg.Wait()
	if n := c.failed.Load(); n != 0 {
		t.Fatalf("%d of %d calls failed during the switches; the first: %v", n, c.done.Load(), c.firstErr.Load())
	}
	t.Logf("%d calls during the switches, none failed", c.done.Load())
}

// healthBackend starts a gRPC server of the health service on ip, until t
// ends, and returns its address.
func healthBackend(t *testing.T, ip string) string {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// shopSlice is the EndpointSlice shop-1 of service shop: one endpoint at
// ip, ready or not, with the port of addr, named http.
func shopSlice(ip, addr string, ready bool) *discoveryv1.EndpointSlice {
	_, p, _ := net.SplitHostPort(addr)
	var port int32
	fmt.Sscan(p, &port)
	name := "http"
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "shop-1", Labels: map[string]string{"kubernetes.io/service-name": "shop"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
}

// homeFirstConfig is the config of TestXDSHomeClusterFirst: east, the
// home, and west read through westKubeconfig; the EndpointSlices of ns
// indexed by service name.
func homeFirstConfig(westKubeconfig, ns string) string {
	return fmt.Sprintf(`clusters:
  - name: east
  - name: west
    kubeconfig: %s
resources:
  - name: endpointslices
    group: discovery.k8s.io
    version: v1
    resource: endpointslices
    namespace: %s
    indexes:
      - name: service-to-endpoints
        key: 'metadata.labels.kubernetes\.io/service-name'
        value: '@endpoints:{"port":"http"}'
`, westKubeconfig, ns)
}

// homeFirstCalls calls the health service through grpc-go's xDS client,
// and once counting, counts the calls that fail and keeps the first
// failure.
type homeFirstCalls struct {
	ctx          context.Context
	h            healthpb.HealthClient
	failed, done atomic.Int64
	counting     atomic.Bool
	firstErr     atomic.Value
}

// call makes one call, within 5 s, and returns the backend that answered.
func (c *homeFirstCalls) call() (string, error) {
	cctx, ccancel := context.WithTimeout(c.ctx, 5*time.Second)
	defer ccancel()
	var p peer.Peer
	_, err := c.h.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil {
		return "", err
	}
	return p.Addr.String(), nil
}

// only waits until 10 calls in a row are answered by want.
func (c *homeFirstCalls) only(t *testing.T, what, want string) {
	t.Helper()
	testenv.Eventually(t, what, func() string {
		got := map[string]int{}
		for range 10 {
			a, err := c.call()
			if err != nil {
				a = err.Error()
				if c.counting.Load() {
					c.failed.Add(1)
					c.firstErr.CompareAndSwap(nil, a)
				}
			}
			c.done.Add(1)
			got[a]++
		}
		if got[want] != 10 {
			return fmt.Sprint(got)
		}
		return ""
	})
}

// callAllAlong calls without pause (1 ms apart) until stop, counting the
// failed calls.
func (c *homeFirstCalls) callAllAlong(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		if _, err := c.call(); err != nil {
			c.failed.Add(1)
			c.firstErr.CompareAndSwap(nil, err.Error())
		}
		c.done.Add(1)
		time.Sleep(time.Millisecond)
	}
}
