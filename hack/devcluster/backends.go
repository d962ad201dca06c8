package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/iidp/metasync/internal/kubeapply"
)

// backends are the gRPC servers that stand behind the reference
// Services while `make run` runs: one per EndpointSlice of the routing
// files, on this host's own address.
type backends struct {
	servers []*grpc.Server
	// addrs are the servers' addresses, by slice (namespace/name).
	addrs map[string]string
}

func (b *backends) stop() {
	for _, s := range b.servers {
		s.Stop()
	}
}

// withBackends reads the objects of files and starts a gRPC health
// server for each EndpointSlice among them, on ip (the host's own
// address: an EndpointSlice may not hold a loopback one). Each slice is
// rewritten to point at its server: one endpoint, the first of the slice
// (its conditions, hints and zone kept), at ip, and every port of the
// slice the server's port. So the reference Services answer addresses
// that answer gRPC calls, and their chains route xDS and resolver clients
// to real servers, never to the files' made-up addresses.
func withBackends(ip string, files ...string) ([]*unstructured.Unstructured, *backends, error) {
	var objs []*unstructured.Unstructured
	for _, f := range files {
		o, err := kubeapply.Objects(f)
		if err != nil {
			return nil, nil, err
		}
		objs = append(objs, o...)
	}
	b := &backends{addrs: map[string]string{}}
	for _, o := range objs {
		if o.GetKind() != "EndpointSlice" {
			continue
		}
		eps, _, _ := unstructured.NestedSlice(o.Object, "endpoints")
		if len(eps) == 0 {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			b.stop()
			return nil, nil, fmt.Errorf("a backend for EndpointSlice %s/%s: %w", o.GetNamespace(), o.GetName(), err)
		}
		s := grpc.NewServer()
		healthpb.RegisterHealthServer(s, health.NewServer())
		go func() { _ = s.Serve(ln) }()
		b.servers = append(b.servers, s)
		port := ln.Addr().(*net.TCPAddr).Port
		b.addrs[o.GetNamespace()+"/"+o.GetName()] = ln.Addr().String()

		first, _ := eps[0].(map[string]any)
		ep := map[string]any{}
		for k, v := range first {
			ep[k] = v
		}
		ep["addresses"] = []any{ip}
		_ = unstructured.SetNestedSlice(o.Object, []any{ep}, "endpoints")
		ports, _, _ := unstructured.NestedSlice(o.Object, "ports")
		if len(ports) == 0 {
			ports = []any{map[string]any{"name": "http"}}
		}
		for _, p := range ports {
			if pm, ok := p.(map[string]any); ok {
				pm["port"] = int64(port)
			}
		}
		_ = unstructured.SetNestedSlice(o.Object, ports, "ports")
		_ = unstructured.SetNestedField(o.Object, "IPv4", "addressType")
	}
	return objs, b, nil
}

// hostIPv4 is this host's first IPv4 address that is neither loopback
// nor link-local: one that an EndpointSlice may hold.
func hostIPv4() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip := n.IP.To4(); ip != nil && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
				return ip.String(), nil
			}
		}
	}
	return "", errors.New("no IPv4 address but loopback (an EndpointSlice may not point at 127.0.0.1)")
}

// writeBootstrap writes the xDS bootstrap of a client of the daemon's
// xDS server at addr, in the zone that the reference slices' hints name
// first, to path.
func writeBootstrap(path, addr string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
  "node": {"id": "make-run-client", "locality": {"zone": "zone-a"}}
}
`, addr)), 0o644)
}

// copyConfig copies the example's config to path, which `make run`
// owns: edits to it are reloaded live and leave the checkout clean.
func copyConfig(from, path string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	header := "# A copy of " + from + " that `make run` serves and owns: edit it while\n" +
		"# make run runs, and metasync reloads it. The next make run writes it anew\n" +
		"# (make run CONFIG=FILE serves a file of your own instead).\n"
	return os.WriteFile(path, append([]byte(header), b...), 0o644)
}
