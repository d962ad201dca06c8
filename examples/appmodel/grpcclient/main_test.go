package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/metasynctest"
)

// TestCallLoop calls "model1" through the chain of examples/appmodel's
// config, over the test double holding one AppModel and one
// EndpointSlice whose pod is a local gRPC server.
func TestCallLoop(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	host, port, _ := net.SplitHostPort(ln.Addr().String())

	fake, err := metasynctest.Load("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	app, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": "base", "namespace": "meta-test", "labels": map[string]string{"iidp": "iidp"}},
		"spec": map[string]any{"models": []string{"model1"}}})
	// The slice's port named http gives the port of chain
	// model-to-endpoints; ready is unset, which reads as ready.
	portNumber, _ := strconv.Atoi(port)
	slice, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": "base-a", "namespace": "meta-test", "labels": map[string]string{"kubernetes.io/service-name": "base"}},
		"ports":     []any{map[string]any{"name": "http", "port": portNumber}},
		"endpoints": []any{map[string]any{"addresses": []string{host}, "conditions": map[string]any{}}}})
	if err := fake.Apply("appmodels", string(app)); err != nil {
		t.Fatal(err)
	}
	if err := fake.Apply("endpointslices", string(slice)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = callLoop(ctx, "metasync:///chains/model-to-endpoints/model1", grpcresolver.NewBuilder(fake), 2, 10*time.Millisecond, &out)
	if err != nil {
		t.Fatal(err)
	}
	if want := "call 1: answered by " + ln.Addr().String() + "\n"; !strings.HasPrefix(out.String(), want) {
		t.Fatalf("printed %q, want it to start with %q", out.String(), want)
	}
}
