package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
)

// The example's files that devcluster serves.
const (
	exampleConfig = "examples/appmodel/config.yaml"
	routingFile   = "examples/appmodel/routing.yaml"
	// anotherApp is an AppModel to apply while it runs (make apply).
	anotherApp = "examples/appmodel/another-app.yaml"
)

// tryInfo is what the Try block names.
type tryInfo struct {
	url, bin, kubeconfig, config string
	xds, bootstrap               string // "" without xDS
	backends                     bool   // gRPC servers behind the Services
}

// tryBlock is the list of commands to try that devcluster prints once
// metasync serve is ready (or has waited long enough).
func tryBlock(i tryInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
==> metasync serves on %[1]s. Try:
  curl -s %[1]s/v1/indexes
  curl -s %[1]s/v1/indexes/model-to-app/keys
  curl -s %[1]s/v1/indexes/model-to-app/keys/model1
  curl -s %[1]s/v1/chains/model-to-endpoints/keys/model1
  curl -s '%[1]s/v1/chains/model-to-endpoints/keys/model1?zone=zone-a'   # the endpoints hinted for zone-a
  curl -s '%[1]s/readyz?verbose'
  curl -s %[1]s/metrics | grep ^metasync_
  %[2]s indexes --server %[1]s
  %[2]s get --server %[1]s model-to-app
  %[2]s get --server %[1]s model-to-app model2
  %[2]s get --server %[1]s --chain model-to-addresses iiot_dataservice
  %[2]s get --server %[1]s --explain --chain model-to-endpoints model1
  %[2]s get --server %[1]s --objects model-to-app model1
  %[2]s get --server %[1]s --watch model-to-app model9     # then, in another terminal:
  make apply FILE=%[4]s    # AppModel "another" serves model9 (server-side apply; no kubectl needed)
  go run ./examples/appmodel/grpcclient --daemon %[1]s --calls 6   # gRPC calls resolved through this daemon
  KUBECONFIG=%[3]s kubectl get appmodels -n meta-test    # if you have kubectl (deleting needs it)
`, i.url, i.bin, i.kubeconfig, anotherApp)
	b.WriteString(tryEnd(i))
	return b.String()
}

// tryEnd is the end of a Try block: xDS, the live reload, the stop.
func tryEnd(i tryInfo) string {
	var b strings.Builder
	if i.xds != "" {
		abs, err := filepath.Abs(i.bootstrap)
		if err != nil {
			abs = i.bootstrap
		}
		fmt.Fprintf(&b, `xDS on %[1]s (bootstrap %[2]s): gRPC clients route by model name with no metasync code:
  GRPC_XDS_BOOTSTRAP=%[2]s go run ./examples/appmodel/grpcclient --xds --calls 6   # grpc-go
  (cd examples/xds-node && npm install && GRPC_XDS_BOOTSTRAP=%[3]s node client.js xds:///chains/model-to-endpoints/model1 6)   # Node
  curl -s %[4]s/v1/xds/clients    # each xDS client: what it follows, sent, acked, unknown
`, i.xds, i.bootstrap, abs, i.url)
		if !i.backends {
			b.WriteString("  (no gRPC servers stand behind the Services here: the calls fail UNAVAILABLE)\n")
		}
	}
	fmt.Fprintf(&b, `Live reload: edit %s while this runs, and metasync reloads it
when it is saved (make run CONFIG=my.yaml serves a file of your own).
Ctrl-C stops everything.`, i.config)
	return b.String()
}

// tryClusters is the Try block of two clusters (make run CLUSTERS=2):
// docs/clusters.md's walk-through, with the run's address and files.
func tryClusters(i tryInfo, west *plane) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
==> metasync serves on %[1]s, for two clusters:
    east, its own connection (the AppModels, the Services, their slices),
    west, read through the ServiceAccount of %[2]s
    (none of the example's objects yet). Try:
  curl -s %[1]s/v1/clusters
  curl -s %[1]s/v1/chains/model-to-endpoints/keys/model1
  make apply FILE=%[3]s    # east: model9's AppModel
  make apply CLUSTER=west FILE=%[4]s    # west: endpoints of base and another
  curl -s %[1]s/v1/chains/model-to-endpoints/keys/model9
  curl -s '%[1]s/v1/chains/model-to-endpoints/keys/model1?cluster=west'
  make stop-apiserver CLUSTER=west     # west cut off: its part stays, marked stale (--stale-after)
  make start-apiserver CLUSTER=west    # west back, fresh
  KUBECONFIG=%[5]s kubectl get endpointslices -n meta-test    # if you have kubectl
`, i.url, remoteReader, anotherApp, westObjects, west.kubeconfig)
	b.WriteString(tryEnd(i))
	return b.String()
}

// freeListenXDS checks that addr is free for the xDS server, and returns
// it; port 0 picks a free port.
func freeListenXDS(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		host, _, _ := net.SplitHostPort(addr)
		if host == "" {
			host = "127.0.0.1"
		}
		return "", fmt.Errorf("metasync serve cannot serve xDS on %s: %v\n"+
			"  Is another `make run` running? Stop it, or pick another address:\n"+
			"    make run XDS_LISTEN=%s:18001   (XDS_LISTEN= for no xDS; devcluster --xds-listen ADDR)",
			addr, err, host)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
