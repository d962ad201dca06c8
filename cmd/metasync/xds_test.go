package main_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// localIPv4 is an address of this machine that an EndpointSlice may hold
// (not loopback, not link-local), or "" when it has none.
func localIPv4() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip := n.IP.To4(); ip != nil && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
				return ip.String()
			}
		}
	}
	return ""
}

// xdsFixture installs, in namespace ns, an AppModel xds-app serving
// model xds-model, and n gRPC health servers on ip, one EndpointSlice
// (xds-app-I) each; it returns their addresses and the reference
// setup's config, watching ns, whose chain model-to-endpoints answers
// them.
func xdsFixture(t *testing.T, ns, ip string, n int) (backends []string, config string) {
	t.Helper()
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, ns)
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer()
		healthpb.RegisterHealthServer(s, health.NewServer())
		go func() { _ = s.Serve(ln) }()
		t.Cleanup(s.Stop)
		backends = append(backends, ln.Addr().String())
	}
	manifest := fmt.Sprintf("apiVersion: iidp.com/v1\nkind: AppModel\nmetadata: {name: xds-app, namespace: %s, labels: {iidp: iidp}}\nspec: {type: model, version: '1', models: [xds-model]}\n", ns)
	for i, b := range backends {
		_, port, _ := net.SplitHostPort(b)
		manifest += fmt.Sprintf("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: xds-app-%d, namespace: %s, labels: {kubernetes.io/service-name: xds-app}}\naddressType: IPv4\nports: [{name: http, port: %s}]\nendpoints: [{addresses: [%q], conditions: {ready: true}}]\n", i, ns, port, ip)
	}
	objects := filepath.Join(t.TempDir(), "objects.yaml")
	_ = os.WriteFile(objects, []byte(manifest), 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, objects); err != nil {
		t.Fatal(err)
	}
	cfg, err := testenv.ReferenceConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	config = filepath.Join(t.TempDir(), "config.yaml")
	_ = os.WriteFile(config, cfg, 0o600)
	return backends, config
}

// TestXDSOnTheControlPlane: `serve --xds-listen` on the real control
// plane, and grpc-go's own xDS client given a bootstrap that names it:
// calls spread over a model's pods (two EndpointSlices), a slice deleted
// takes its pod out of the calls, and the daemon restarted with a
// snapshot while the apiserver is away keeps the calls going.
func TestXDSOnTheControlPlane(t *testing.T) {
	testenv.Need(t, env)
	ip := localIPv4()
	if ip == "" {
		t.Skip("no IPv4 address but loopback: an EndpointSlice may not point at 127.0.0.1")
	}
	backends, config := xdsFixture(t, "xds-e2e", ip, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	target := strings.TrimSuffix(strings.TrimPrefix(env.Config.Host, "https://"), "/")
	apiAddr, addr, xdsAddr := testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t)
	proxy, err := testenv.NewProxy(apiAddr, target)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { proxy.Close() }()
	snapDir := filepath.Join(t.TempDir(), "snapshots")
	args := []string{"--config", config, "--kubeconfig", env.WriteKubeconfig(t, apiAddr), "--listen", addr, "--xds-listen", xdsAddr, "--snapshot-dir", snapDir}
	d := start(t, nil, args...)
	waitHTTP(t, d, addr)

	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"e2e","locality":{"zone":"z"}}}`, xdsAddr)
	builder, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///chains/model-to-endpoints/xds-model", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(builder))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	calls := func(n int) map[string]int {
		got := map[string]int{}
		h := healthpb.NewHealthClient(conn)
		for i := 0; i < n; i++ {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			var p peer.Peer
			_, err := h.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
			ccancel()
			if err != nil {
				got["error "+status.Code(err).String()]++
			} else {
				got[p.Addr.String()]++
			}
		}
		return got
	}
	testenv.Eventually(t, "calls reach both pods", func() string {
		if got := calls(10); got[backends[0]] == 0 || got[backends[1]] == 0 {
			return fmt.Sprint(got)
		}
		return ""
	})
	if err := env.Kube.DiscoveryV1().EndpointSlices("xds-e2e").Delete(ctx, "xds-app-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the deleted slice's pod gets no call", func() string {
		if got := calls(10); got[backends[0]] != 10 {
			return fmt.Sprint(got)
		}
		return ""
	})
	if got := metric(t, base(addr), "metasync_xds_clients"); got != "1" {
		t.Errorf("metasync_xds_clients %q, want 1", got)
	}
	for _, typ := range []string{"listener", "route", "cluster", "endpoint"} {
		if got := metric(t, base(addr), `metasync_xds_resources{type="`+typ+`"}`); got != "1" {
			t.Errorf("metasync_xds_resources of %s %q, want 1 (one client, one target)", typ, got)
		}
	}
	if a := call(t, "GET", base(addr)+"/v1/xds/clients"); a.code != 200 || !strings.Contains(a.raw, `"node":"e2e"`) || !strings.Contains(a.raw, `"chains/model-to-endpoints/xds-model"`) {
		t.Errorf("GET /v1/xds/clients = %d %s", a.code, a.raw)
	}

	// The daemon restarts from its snapshot while the apiserver is away:
	// the calls keep going to the pod it knew.
	if err := d.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	<-d.done
	proxy.Close()
	d = start(t, nil, args...)
	waitHTTP(t, d, addr)
	testenv.Eventually(t, "calls served from the snapshot", func() string {
		if got := calls(5); got[backends[0]] != 5 {
			return fmt.Sprint(got)
		}
		return ""
	})
}
