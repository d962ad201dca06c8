package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	compiled "github.com/iidp/metasync/internal/plan"

	"k8s.io/klog/v2"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/cmd/metasync/internal/consul"
	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/cmd/metasync/internal/xds"
	"github.com/iidp/metasync/internal/tlsfiles"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// serve runs the daemon: it loads the config, installs the CRDs it lists,
// watches its resources and answers lookups over HTTP until SIGTERM or
// SIGINT, then drains (/readyz fails, --shutdown-delay, HTTP shut down,
// watches stopped). A second signal exits at once.
func serve(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", stderr)
	config := fs.String("config", "", "config file (required)")
	kube := addKubeFlags(fs,
		"kubeconfig file (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)",
		"kubeconfig context (default: the current context)")
	listen := fs.String("listen", "", "HTTP listen address (default: the config's server.listen, 127.0.0.1:8080)")
	xdsListen := fs.String("xds-listen", "", "also serve xDS v3 (ADS, state of the world) on this address, for gRPC clients with xDS support: targets xds:///indexes/INDEX/KEY and xds:///chains/CHAIN/KEY (default: off); with --auth and TLS as the HTTP API: over TLS with --tls-cert-file, clients send bearer tokens with --auth=tokenreview, loopback only without --auth")
	consulListen := fs.String("consul-listen", "", "also serve the read side of the Consul HTTP API on this address (agent/self, catalog/services, catalog/service, health/service, with blocking queries), for Consul's discovery clients: a service is a key of a chain or index of --consul-services, its instances the key's host:port values (default: off); with --auth and TLS as the HTTP API: the token in X-Consul-Token or Authorization: Bearer with --auth=tokenreview, loopback only without --auth")
	consulServices := fs.String("consul-services", "", "with --consul-listen: the chains and indexes whose keys are Consul services, as chains/NAME[,indexes/NAME...]")
	consulBlocking := fs.Int("consul-max-blocking", consul.DefaultBlocking, "with --consul-listen: most Consul blocking queries open at once, of all callers; beyond, 503 (0: no limit)")
	consulPerCaller := fs.Int("consul-max-blocking-per-caller", consul.DefaultBlockingPerCaller, "with --consul-listen: most Consul blocking queries that one caller (the identity with --auth=tokenreview, else the remote address) may hold open; beyond, 429 (0: no limit)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	staleAfter := fs.Duration("stale-after", msync.DefaultStaleAfter, "a synced resource whose watch keeps failing this long is not ready")
	heartbeat := fs.Duration("stream-heartbeat", server.DefaultHeartbeat, "a change stream (?watch=true) that sent nothing this long gets a heartbeat frame")
	shutdownDelay := fs.Duration("shutdown-delay", 0, "on SIGTERM, fail /readyz this long before draining HTTP (let load balancers notice)")
	snapshotDir := fs.String("snapshot-dir", "", "write the indexes and each resource's resourceVersion here, and start warm from them: answers (marked stale) before the apiserver is reached, watches resumed without a list")
	snapshotInterval := fs.Duration("snapshot-interval", msync.DefaultSnapshotInterval, "with --snapshot-dir: how often to write the snapshot (also written at shutdown)")
	streamingList := listMode("false")
	fs.Var(&streamingList, "streaming-list", `=true (or the flag alone): list each resource as the apiserver streams it (a watch with sendInitialEvents) instead of a LIST; =auto: only the resources watched whole (no namespace, no label or field selector); =false: LIST. Measured: less apiserver memory when many daemons start at once and watch most of their resource's objects, as much or more when they watch a small part of a large resource, and more apiserver CPU and a longer first list (see docs/warm-start.md); LIST where the apiserver refuses it`)
	memoryLimit := fs.String("memory-limit", "auto", `the Go runtime's soft memory limit: "auto" (90 % of the container's cgroup memory limit, unless GOMEMLIMIT is set), "off", or a quantity such as 400Mi or 0.5Gi`)
	auth := fs.String("auth", "", `"tokenreview": require Kubernetes bearer tokens (TokenReview, SubjectAccessReview); "none": no authentication. Default: none on loopback; required beyond it`)
	authOpts := authOptions{
		audience:          fs.String("auth-audience", "", `with --auth=tokenreview: accept only tokens issued for this audience (projected service account tokens with "audience: NAME"); a token for the apiserver's own audience is refused with 401`),
		insecurePlaintext: fs.Bool("insecure-plaintext-auth", false, "allow --auth=tokenreview beyond loopback without TLS: callers' bearer tokens then cross the network in cleartext"),
	}
	tlsCert := fs.String("tls-cert-file", "", "serve HTTPS with the PEM certificate (chain) in this file, read again when it changes (with --tls-private-key-file)")
	tlsKey := fs.String("tls-private-key-file", "", "the PEM private key of --tls-cert-file, read again when it changes")
	limitsOf := addLimitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	if err := envForFlags(fs, stderr); err != nil {
		return err
	}
	if *config == "" || fs.NArg() > 0 {
		if a := fs.Arg(0); given(fs, "streaming-list") && new(listMode).Set(a) == nil {
			// "--streaming-list auto": a boolean flag takes its value
			// after "=" only, and the word is left over.
			fmt.Fprintf(stderr, "metasync serve: %q is not a flag's value here: write --streaming-list=%s\n", a, a)
			return exitError{2}
		}
		fmt.Fprintln(stderr, "metasync serve: --config FILE is required, and nothing else")
		return exitError{2}
	}
	for name, d := range map[string]time.Duration{"stream-heartbeat": *heartbeat, "stale-after": *staleAfter, "snapshot-interval": *snapshotInterval} {
		if d <= 0 {
			fmt.Fprintf(stderr, "metasync serve: --%s %v: must be positive\n", name, d)
			return exitError{2}
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "metasync serve: --log-level %q: %v\n", *logLevel, err)
		return exitError{2}
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	klog.SetSlogLogger(log.With("source", "client-go"))
	limits, xdsLimits, err := limitsOf.limits(fdLimit(), *xdsListen != "", log)
	if err != nil {
		fmt.Fprintln(stderr, "metasync serve:", err)
		return exitError{2}
	}
	if err := setMemoryLimit(*memoryLimit, "/sys/fs/cgroup", log); err != nil {
		fmt.Fprintln(stderr, "metasync serve:", err)
		return exitError{2}
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		fmt.Fprintln(stderr, "metasync serve: --tls-cert-file and --tls-private-key-file go together")
		return exitError{2}
	}
	var cert *tlsfiles.Certificate
	if *tlsCert != "" {
		c, err := tlsfiles.NewCertificate(*tlsCert, *tlsKey, log)
		if err != nil {
			fmt.Fprintln(stderr, "metasync serve:", err)
			return exitError{2}
		}
		cert = c
	}
	authOpts.tls = cert != nil
	// Before the first request: every request to the apiserver counts.
	clientMetrics := server.ClientGoMetrics()

	flags := map[string]any{}
	if *listen != "" {
		flags["server.listen"] = *listen
	}
	loadOpts := schema.LoadOptions{Environ: os.Environ(), Flags: flags}
	loaded := hashFile(*config)
	plan, err := schema.LoadPlan(*config, loadOpts)
	if err != nil {
		n := printProblems(stderr, err)
		log.Error("invalid config: nothing started", "config", *config, "problems", n)
		return exitError{1}
	}
	restCfg, source, err := kube.restConfig()
	if err != nil {
		log.Error("no cluster to talk to", "error", err.Error())
		return exitError{1}
	}
	if *snapshotDir != "" {
		if err := os.MkdirAll(*snapshotDir, 0o700); err != nil {
			fmt.Fprintf(stderr, "metasync serve: --snapshot-dir: %v\n", err)
			return exitError{2}
		}
	}
	// The engine reads its snapshot, if any, before anything is asked of
	// the apiserver.
	engine, err := msync.New(plan, restCfg, msync.Options{Logger: log, StaleAfter: *staleAfter,
		SnapshotDir: *snapshotDir, SnapshotInterval: *snapshotInterval, StreamingList: streamingList == "true", StreamingListAuto: streamingList == "auto"})
	if err != nil {
		log.Error("engine", "error", err.Error())
		return exitError{1}
	}
	warm := engine.SnapshotStatus().Load == "warm"
	var crdsLater []*schema.CRD
	if len(plan.CRDs()) > 0 {
		crds, err := readCRDs(plan, log)
		if err == nil {
			err = applyCRDs(crds, restCfg, log)
			if err != nil && warm {
				// The apiserver is not there: serve the snapshot and try again.
				log.Warn("CRDs not installed: answering from the snapshot, trying again every 10s", "error", err.Error())
				crdsLater, err = crds, nil
			}
		}
		if err != nil {
			printProblems(stderr, err)
			log.Error("CRDs not installed: nothing started", "error", err.Error())
			return exitError{1}
		}
	}
	// Paths through fields that the installed CRDs lack would index
	// nothing: refused, as validate --cluster refuses them. A warm start
	// does not wait long for an apiserver that is away.
	within := 15 * time.Second
	if warm {
		within = 2 * time.Second
	}
	if err := checkInstalledPaths(plan, restCfg, within, log); err != nil {
		n := printProblems(stderr, err)
		log.Error("config paths not in the installed CRDs' schemas: nothing started", "config", *config, "problems", n)
		return exitError{1}
	}
	addr := plan.Server().Listen
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("listen", "address", addr, "error", err.Error())
		return exitError{1}
	}
	guard, err := authFor(*auth, addr, authOpts, restCfg, log)
	if err != nil {
		ln.Close()
		return err
	}
	var consulLn net.Listener
	var consulSources []consul.Source
	if *consulListen != "" || *consulServices != "" {
		if consulSources, err = consulFlags(*consulListen, *consulServices, *consulBlocking, *consulPerCaller, engine, stderr); err != nil {
			ln.Close()
			return err
		}
		if consulLn, err = listenFace("consul-listen", "Consul", "", *consulListen, *auth, authOpts, log, stderr); err != nil {
			ln.Close()
			return err
		}
	}
	var xdsLn net.Listener
	if *xdsListen != "" {
		if xdsLn, err = listenXDS(*xdsListen, *auth, authOpts, log, stderr); err != nil {
			ln.Close()
			return err
		}
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	handler := server.New(engine, log)
	handler.SetHeartbeat(*heartbeat)
	handler.SetLimits(limits)
	reload := newReloader(*config, loaded, loadOpts, plan, engine, restCfg, log)
	handler.MustRegister(reload.collectors()...)
	handler.MustRegister(clientMetrics...)
	if cert != nil {
		handler.MustRegister(cert.Collector())
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	srv := handler.HTTPServer(addr, log, guard)
	engineCtx, stopEngine := context.WithCancel(context.Background())
	engineDone := make(chan struct{})
	go func() {
		defer close(engineDone)
		_ = engine.Start(engineCtx)
	}()
	ln = handler.Listener(ln) // at most limits.Connections
	serveErr := make(chan error, 1)
	if cert != nil {
		srv.TLSConfig = cert.ServerConfig()
		// HTTP/1.1 only, as over plain HTTP: each stream its connection.
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
		go func() { serveErr <- srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { serveErr <- srv.Serve(ln) }()
	}
	go reportProgress(engineCtx, engine, log)
	go returnFreeMemory(engineCtx, log, engine)
	go trimAfterStreams(engineCtx, log, handler)
	if crdsLater != nil {
		go installLater(engineCtx, crdsLater, restCfg, log)
	}
	go reload.run(engineCtx, hup)
	var xdsSrv *xds.Transport
	if xdsLn != nil {
		xdsSrv = startXDS(xdsLn, engine, handler, guard, cert, xdsLimits, log)
	}
	var consulSrv *http.Server
	if consulLn != nil {
		consulSrv = startConsul(consulLn, engine, consulSources, handler, guard, cert,
			consul.Limits{Blocking: *consulBlocking, BlockingPerCaller: *consulPerCaller}, log)
	}
	log.Info("serving", "address", ln.Addr().String(), "tls", cert != nil, "config", *config, "cluster", restCfg.Host, "kubeconfig", source,
		"resources", len(compiled.Of(plan).Resources), "version", version)

	select {
	case sig := <-sigs:
		log.Info("stopping: /readyz fails from now on", "signal", sig.String())
	case err := <-serveErr:
		log.Error("HTTP server failed", "error", err.Error())
		stopEngine()
		<-engineDone
		return exitError{1}
	}
	go func() {
		sig := <-sigs
		log.Warn("second signal: exiting now", "signal", sig.String())
		os.Exit(1)
	}()
	handler.SetStopping()
	time.Sleep(*shutdownDelay)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("HTTP drain incomplete", "error", err.Error())
	}
	if xdsSrv != nil {
		_ = xdsSrv.Close() // ADS streams last: end them (clients reconnect elsewhere)
	}
	if consulSrv != nil {
		// Blocking queries answer what they hold at once, then the
		// connections close.
		if err := consulSrv.Shutdown(ctx); err != nil {
			log.Warn("Consul facade drain incomplete", "error", err.Error())
		}
	}
	stopEngine()
	select {
	case <-engineDone:
	case <-ctx.Done():
		log.Warn("watches did not stop in time")
	}
	log.Info("stopped")
	return nil
}

// reportProgress logs the initial sync of each resource every 2 s until
// every resource has synced, then how long it took.
func reportProgress(ctx context.Context, e *msync.Engine, log *slog.Logger) {
	start := time.Now()
	done := make(chan struct{})
	go func() {
		if e.WaitForSync(ctx) == nil {
			close(done)
		}
	}()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			log.Info("initial sync done", "took", time.Since(start).Round(time.Millisecond).String())
			// The initial lists' garbage is the largest the process makes:
			// give it back to the kernel now rather than keep it resident
			// until the runtime's scavenger gets to it.
			debug.FreeOSMemory()
			return
		case <-tick.C:
		}
		for _, st := range e.Status() {
			if st.Synced {
				continue
			}
			attrs := []any{"resource", st.Name, "listed", st.Listed, "elapsed", time.Since(start).Round(time.Second).String()}
			if st.Error != "" {
				attrs = append(attrs, "error", st.Error)
			}
			log.Info("initial sync in progress", attrs...)
		}
	}
}

var _ http.Handler = (*server.Server)(nil)

// startXDS serves xDS on ln, with the limits l, until its server is
// closed: the status route on the HTTP API, the metrics in its
// registry, and with a guard each client's token and each target's
// access checked as for the HTTP lookup of the same key.
func startXDS(ln net.Listener, engine *msync.Engine, handler *server.Server, guard *auth.TokenAuth, cert *tlsfiles.Certificate, l xds.Limits, log *slog.Logger) *xds.Transport {
	ads := xds.New(engine, log.With("face", "xds"), handler.Registerer())
	ads.SetLimits(l)
	if guard != nil {
		ads.SetAuthorizer(guard.Check)
	}
	handler.Handle("/v1/xds/clients", ads.StatusHandler())
	var tlsConfig *tls.Config
	if cert != nil {
		tlsConfig = cert.ServerConfig()
	}
	srv := ads.Transport(tlsConfig)
	ln = ads.Listener(ln)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("xDS server failed", "error", err.Error())
		}
	}()
	log.Info("serving xDS", "address", ln.Addr().String(), "tls", cert != nil, "auth", guard != nil)
	return srv
}

// listenXDS listens for xDS on addr, under the rules of the HTTP API's
// address (see listenFace).
func listenXDS(addr, auth string, o authOptions, log *slog.Logger, stderr io.Writer) (net.Listener, error) {
	return listenFace("xds-listen", "xDS", " (with --tls-cert-file: grpc sends call credentials over TLS only)", addr, auth, o, log, stderr)
}

// listenFace listens on addr for a face of the daemon other than its
// HTTP API (xDS, the Consul facade), given by flag, under the rules of
// the HTTP API's address (see authFor): beyond loopback it needs --auth,
// and with --auth=tokenreview TLS (or --insecure-plaintext-auth), since
// clients then send their tokens. hint adds to the refusal without
// --auth.
func listenFace(flag, face, hint, addr, auth string, o authOptions, log *slog.Logger, stderr io.Writer) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		fmt.Fprintf(stderr, "metasync serve: --%s %q: %v\n", flag, addr, err)
		return nil, exitError{2}
	}
	if !isLoopback(host) {
		switch {
		case auth == "":
			fmt.Fprintf(stderr, "metasync serve: --%s %s: beyond loopback %s clients must authenticate: --auth=tokenreview%s, or --auth=none to serve %s without authentication on purpose\n", flag, addr, face, hint, face)
			return nil, exitError{2}
		case auth == "none":
			log.Warn(face+" listens beyond loopback without authentication, as --auth=none asks", "address", addr)
		case auth == "tokenreview" && !o.tls && !*o.insecurePlaintext:
			fmt.Fprintf(stderr, "metasync serve: --%s %s: --auth=tokenreview beyond loopback needs TLS (--tls-cert-file and --tls-private-key-file), or --insecure-plaintext-auth to let clients send their bearer tokens in cleartext on purpose\n", flag, addr)
			return nil, exitError{2}
		case auth == "tokenreview":
			if !o.tls {
				log.Warn(face+" clients' bearer tokens cross the network in cleartext, as --insecure-plaintext-auth asks", "address", addr)
			}
			if *o.audience == "" {
				log.Warn("without --auth-audience, "+face+" clients send tokens that the apiserver accepts too: give them projected tokens of an audience of metasync's own and set --auth-audience", "address", addr)
			}
		default:
			fmt.Fprintf(stderr, "metasync serve: --auth %q: must be \"tokenreview\" or \"none\"\n", auth)
			return nil, exitError{2}
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "metasync serve: --%s: %v\n", flag, err)
		return nil, exitError{1}
	}
	return ln, nil
}
