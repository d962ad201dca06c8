// Command grpcclient calls a model's servers through metasync's gRPC
// resolver: one target, metasync:///chains/model-to-endpoints/MODEL, and
// the channel follows the model's app and its pods as they change: IP:PORT
// of the port named http in each EndpointSlice, the ready endpoints (or,
// when the app has none, the serving terminating ones).
//
//	go run ./examples/appmodel/grpcclient --kubeconfig ~/.kube/config --model model1
//
// Each second it calls the standard gRPC health service of whichever pod
// round_robin picks and prints the pod's address, or the error (with no
// ready pod: UNAVAILABLE at once). With --daemon URL it resolves through a
// metasync daemon's change streams instead of watching the cluster itself
// (--token-file and --ca-file for a daemon that reviews tokens over TLS).
//
// With --xds it resolves through a daemon's xDS server instead, as any
// gRPC client with xDS support does, with no metasync code in the path:
// grpc-go's own xds resolver reads the bootstrap named by
// GRPC_XDS_BOOTSTRAP (`make run` writes bin/xds-bootstrap.json) and dials
// xds:///chains/model-to-endpoints/MODEL:
//
//	GRPC_XDS_BOOTSTRAP=bin/xds-bootstrap.json go run ./examples/appmodel/grpcclient --xds --calls 6
//
// With --demo it needs nothing but `make run`'s cluster: it starts two
// local gRPC servers, writes an AppModel serving model grpc-demo-model
// and a Service with an EndpointSlice per server, calls the model, and
// deletes what it wrote when it ends:
//
//	go run ./examples/appmodel/grpcclient --kubeconfig bin/dev-kubeconfig --demo --calls 6
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and its balancers, for --xds
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "grpcclient:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	flags := flag.NewFlagSet("grpcclient", flag.ContinueOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)")
	config := flags.String("config", "examples/appmodel/config.yaml", "metasync config file")
	daemon := flags.String("daemon", "", "resolve through this metasync daemon (such as http://127.0.0.1:8080, or https://metasync.metasync.svc:8080) instead of in process")
	tokenFile := flags.String("token-file", "", "with --daemon: send the token in this file (a projected token for the daemon's --auth-audience), read again at each connection")
	caFile := flags.String("ca-file", "", "with an https:// --daemon: verify it against the CA certificates in this file")
	model := flags.String("model", "model1", "model to call")
	port := flags.Int("port", 0, "resolve bare IPs (chain model-to-addresses) with this port instead of the slices' own IP:PORT (chain model-to-endpoints)")
	calls := flags.Int("calls", 0, "stop after this many calls (0: until Ctrl-C)")
	viaXDS := flags.Bool("xds", false, "resolve xds:///chains/model-to-endpoints/MODEL through the xDS server that the bootstrap of GRPC_XDS_BOOTSTRAP names (make run writes bin/xds-bootstrap.json)")
	demo := flags.Bool("demo", false, "start two local gRPC servers, write an AppModel, a Service and EndpointSlices that point at them (deleted at the end), and call their model: for make run's cluster")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *viaXDS {
		if *demo || *daemon != "" || *port != 0 {
			return fmt.Errorf("--xds resolves through the bootstrap's server alone: no --demo, --daemon or --port")
		}
		if os.Getenv("GRPC_XDS_BOOTSTRAP") == "" && os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") == "" {
			return fmt.Errorf("--xds needs GRPC_XDS_BOOTSTRAP, the bootstrap file that names the daemon's --xds-listen (make run writes bin/xds-bootstrap.json)")
		}
		return callLoop(ctx, "xds:///chains/model-to-endpoints/"+url.PathEscape(*model), nil, *calls, time.Second, out)
	}
	if *demo {
		restConfig, err := restConfigOf(*kubeconfig)
		if err != nil {
			return err
		}
		cleanup, err := startDemo(ctx, restConfig, out)
		if err != nil {
			return err
		}
		defer cleanup()
		*model = demoModel
	}
	var builder resolver.Builder
	if *daemon != "" {
		var opts []grpcresolver.Option
		if *tokenFile != "" {
			opts = append(opts, grpcresolver.WithTokenFile(*tokenFile))
		}
		if *caFile != "" {
			opts = append(opts, grpcresolver.WithCAFile(*caFile))
		}
		builder = grpcresolver.NewRemoteBuilder(*daemon, opts...)
	} else {
		engine, stop, err := startEngine(ctx, *kubeconfig, *config)
		if err != nil {
			return err
		}
		defer stop()
		builder = grpcresolver.NewBuilder(engine)
	}
	target := "metasync:///chains/model-to-endpoints/" + url.PathEscape(*model)
	if *port != 0 {
		target = fmt.Sprintf("metasync:///chains/model-to-addresses/%s?port=%d", url.PathEscape(*model), *port)
	}
	return callLoop(ctx, target, builder, *calls, time.Second, out)
}

// startEngine runs an engine of the config until stop is called.
func startEngine(ctx context.Context, kubeconfig, config string) (*msync.Engine, func(), error) {
	restConfig, err := restConfigOf(kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	plan, err := schema.LoadPlan(config, schema.LoadOptions{Environ: os.Environ()})
	if err != nil {
		return nil, nil, err
	}
	engine, err := msync.New(plan, restConfig, msync.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = engine.Start(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	syncCtx, syncDone := context.WithTimeout(ctx, time.Minute)
	defer syncDone()
	if err := engine.WaitForSync(syncCtx); err != nil {
		stop()
		return nil, nil, err
	}
	return engine, stop, nil
}

// restConfigOf finds the cluster as kubectl does: the file kubeconfig,
// else KUBECONFIG, else ~/.kube/config, else in-cluster.
func restConfigOf(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// callLoop dials target and calls the health service every interval,
// printing who answered, n times (0: until ctx ends). builder resolves
// the target; nil: the resolvers registered (xds:///, whose balancing
// comes from the xDS server).
func callLoop(ctx context.Context, target string, builder resolver.Builder, n int, interval time.Duration, out io.Writer) error {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())} // use real credentials between pods
	if builder != nil {
		opts = append(opts, grpc.WithResolvers(builder),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	for i := 0; n == 0 || i < n; i++ {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var p peer.Peer
		_, err := health.Check(callCtx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		cancel()
		if err != nil {
			fmt.Fprintf(out, "call %d: %v\n", i+1, err)
		} else {
			fmt.Fprintf(out, "call %d: answered by %s\n", i+1, p.Addr)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
	return nil
}
