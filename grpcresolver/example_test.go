package grpcresolver_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
)

// ExampleNewBuilder tests gRPC routing with no cluster: a Fake holds the
// objects that route model1 (an AppModel, and an EndpointSlice whose
// endpoint is a local gRPC server), and a call to the model reaches it.
func ExampleNewBuilder() {
	// A backend: a gRPC server on a free local port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	port := ln.Addr().(*net.TCPAddr).Port

	plan, err := schema.Compile(&schema.Config{
		Resources: []schema.Resource{{
			Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
			Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
		}, {
			Name: "endpointslices", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices",
			Indexes: []schema.Index{{
				Name:  "service-to-endpoints",
				Key:   `metadata.labels.kubernetes\.io/service-name`,
				Value: `@endpoints:{"port":"grpc"}`,
			}},
		}},
		Chains: []schema.Chain{{Name: "model-to-endpoints", Indexes: []string{"model-to-app", "service-to-endpoints"}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		log.Fatal(err)
	}
	err = fake.Apply("appmodels", `
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: iiot, namespace: demo}
spec: {models: [model1]}
`)
	if err != nil {
		log.Fatal(err)
	}
	err = fake.Apply("endpointslices", fmt.Sprintf(`
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: iiot-abc, namespace: demo, labels: {kubernetes.io/service-name: iiot}}
ports: [{name: grpc, port: %d}]
endpoints: [{addresses: [127.0.0.1]}]
`, port))
	if err != nil {
		log.Fatal(err)
	}

	conn, err := grpc.NewClient("metasync:///chains/model-to-endpoints/model1",
		grpc.WithResolvers(grpcresolver.NewBuilder(fake)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("model1 answered:", resp.Status)
	// Output: model1 answered: SERVING
}

// ExampleNewRemoteBuilder resolves through a daemon's HTTP API instead of
// an engine in the process: the target is the same, and each target is
// one change stream that the daemon keeps up to date. With TLS and
// --auth=tokenreview, the CA file and the token file are read again for
// each connection (a rotated CA or a projected token needs no restart).
func ExampleNewRemoteBuilder() {
	builder := grpcresolver.NewRemoteBuilder("https://metasync.metasync.svc:8080",
		grpcresolver.WithCAFile("/etc/metasync/ca.crt"),
		grpcresolver.WithTokenFile("/var/run/secrets/tokens/metasync"))
	conn, err := grpc.NewClient("metasync:///chains/model-to-endpoints/model1",
		grpc.WithResolvers(builder),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// Calls on conn go to model1's endpoints as the daemon answers them.
}
