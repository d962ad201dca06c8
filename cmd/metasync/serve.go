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
	"strconv"
	"syscall"
	"time"

	compiled "github.com/iidp/metasync/internal/plan"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/cmd/metasync/internal/consul"
	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/cmd/metasync/internal/xds"
	"github.com/iidp/metasync/internal/tlsfiles"
	"github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/schema/cluster"
	msync "github.com/iidp/metasync/sync"
)

// serve runs the daemon: it loads the config, installs the CRDs it lists,
// watches its resources and answers lookups over HTTP until SIGTERM or
// SIGINT, then drains (/readyz fails, --shutdown-delay, HTTP shut down,
// watches stopped). A second signal exits at once.
func serve(args []string, stdout, stderr io.Writer) error {
	f, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	log, limits, cert, err := f.setup(stderr)
	if err != nil {
		return err
	}
	// Before the first request: every request to the apiserver counts.
	clientMetrics := server.ClientGoMetrics()
	d, err := f.prepare(log, stderr)
	if err != nil {
		return err
	}
	if err := f.open(d, cert, log, stderr); err != nil {
		return err
	}
	return f.run(d, limits, cert, clientMetrics, log)
}

// daemon is what serve prepared: the config, the cluster, the engine,
// and the listeners.
type daemon struct {
	plan      *schema.Plan
	loaded    [32]byte
	loadOpts  schema.LoadOptions
	restCfg   *rest.Config
	source    string
	engine    *msync.Engine
	crdsLater []*cluster.CRD

	addr                string
	ln, consulLn, xdsLn net.Listener
	consulSources       []consul.Source
	guard               *auth.TokenAuth
}

// prepare loads the config, finds the cluster, makes the engine (which
// reads its snapshot, if any, before anything is asked of the
// apiserver), installs the CRDs and checks the paths against them.
func (f *serveFlags) prepare(log *slog.Logger, stderr io.Writer) (*daemon, error) {
	d := &daemon{}
	flags := map[string]any{}
	if *f.listen != "" {
		flags["server.listen"] = *f.listen
	}
	d.loadOpts = schema.LoadOptions{Environ: os.Environ(), Flags: flags}
	d.loaded = hashFile(*f.config)
	var err error
	if d.plan, err = schema.LoadPlan(*f.config, d.loadOpts); err != nil {
		n := printProblems(stderr, err)
		log.Error("invalid config: nothing started", "config", *f.config, "problems", n)
		return nil, exitError{1}
	}
	connectionChecks(*f.staleAfter)
	if d.restCfg, d.source, err = f.kube.restConfig(); err != nil {
		log.Error("no cluster to talk to", "error", err.Error())
		return nil, exitError{1}
	}
	if *f.snapshotDir != "" {
		if err := os.MkdirAll(*f.snapshotDir, 0o700); err != nil {
			fmt.Fprintf(stderr, "metasync serve: --snapshot-dir: %v\n", err)
			return nil, exitError{2}
		}
	}
	d.engine, err = msync.New(d.plan, d.restCfg, msync.Options{Logger: log, StaleAfter: *f.staleAfter,
		SnapshotDir: *f.snapshotDir, SnapshotInterval: *f.snapshotInterval,
		StreamingList: f.streamingList == "true", StreamingListAuto: f.streamingList == "auto"})
	if err != nil {
		log.Error("engine", "error", err.Error())
		return nil, exitError{1}
	}
	warm := d.engine.Inspect().SnapshotStatus().Load == "warm"
	if len(d.plan.CRDs()) > 0 {
		crds, err := readCRDs(d.plan, log)
		if err == nil {
			err = applyCRDs(crds, d.restCfg, log)
			if err != nil && warm {
				// The apiserver is not there: serve the snapshot and try again.
				log.Warn("CRDs not installed: answering from the snapshot, trying again every 10s", "error", err.Error())
				d.crdsLater, err = crds, nil
			}
		}
		if err != nil {
			printProblems(stderr, err)
			log.Error("CRDs not installed: nothing started", "error", err.Error())
			return nil, exitError{1}
		}
	}
	// Paths through fields that the installed CRDs lack would index
	// nothing: refused, as validate --cluster refuses them. A warm start
	// does not wait long for an apiserver that is away.
	within := 15 * time.Second
	if warm {
		within = 2 * time.Second
	}
	if err := checkInstalledPaths(d.plan, d.restCfg, within, log); err != nil {
		n := printProblems(stderr, err)
		log.Error("config paths not in the installed CRDs' schemas: nothing started", "config", *f.config, "problems", n)
		return nil, exitError{1}
	}
	return d, nil
}

// open opens the HTTP API's listener, and the Consul facade's and the
// xDS server's when asked for, under the rules of --auth (see authFor
// and listenFace); on an error none stays open.
func (f *serveFlags) open(d *daemon, cert *tlsfiles.Certificate, log *slog.Logger, stderr io.Writer) (err error) {
	f.authOpts.tls = cert != nil
	d.addr = d.plan.Server().Listen
	if d.ln, err = net.Listen("tcp", d.addr); err != nil {
		log.Error("listen", "address", d.addr, "error", err.Error())
		return exitError{1}
	}
	defer func() {
		if err != nil {
			for _, l := range []net.Listener{d.ln, d.consulLn, d.xdsLn} {
				if l != nil {
					l.Close()
				}
			}
		}
	}()
	if d.guard, err = authFor(*f.auth, d.addr, f.authOpts, d.restCfg, log); err != nil {
		return err
	}
	if *f.consulListen != "" || *f.consulServices != "" {
		if d.consulSources, err = consulFlags(*f.consulListen, *f.consulServices, d.engine, stderr); err != nil {
			return err
		}
		if d.consulLn, err = listenFace("consul-listen", "Consul", "", *f.consulListen, *f.auth, f.authOpts, log, stderr); err != nil {
			return err
		}
	}
	if *f.xdsListen != "" {
		if d.xdsLn, err = listenXDS(*f.xdsListen, *f.auth, f.authOpts, log, stderr); err != nil {
			return err
		}
	}
	return nil
}

// run serves until SIGTERM or SIGINT, then drains: /readyz fails,
// --shutdown-delay, HTTP shut down, xDS connections sent a GOAWAY and
// their streams ended UNAVAILABLE, Consul's blocking
// queries answered, watches stopped. A second signal exits at once.
func (f *serveFlags) run(d *daemon, limits faceLimits, cert *tlsfiles.Certificate, clientMetrics []prometheus.Collector, log *slog.Logger) error {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	engine := d.engine
	handler := server.New(engine.Inspect(), log)
	handler.SetHeartbeat(*f.heartbeat)
	handler.SetLimits(limits.http)
	reload := newReloader(*f.config, d.loaded, d.loadOpts, d.plan, engine, d.restCfg, log)
	handler.MustRegister(reload.collectors()...)
	handler.MustRegister(clientMetrics...)
	if cert != nil {
		handler.MustRegister(cert.Collector())
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	srv := handler.HTTPServer(d.addr, log, d.guard)
	engineCtx, stopEngine := context.WithCancel(context.Background())
	engineDone := make(chan struct{})
	go func() {
		defer close(engineDone)
		_ = engine.Start(engineCtx)
	}()
	ln := handler.Listener(d.ln) // at most limits.http.Connections
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
	go returnFreeMemory(engineCtx, log, engine.Inspect())
	go trimAfterStreams(engineCtx, log, handler)
	if d.crdsLater != nil {
		go installLater(engineCtx, d.crdsLater, d.restCfg, log)
	}
	go reload.run(engineCtx, hup)
	var xdsSrv *xds.Transport
	if d.xdsLn != nil {
		xdsSrv = startXDS(d.xdsLn, engine, handler, d.guard, cert, limits.xds, log)
	}
	var consulSrv *http.Server
	if d.consulLn != nil {
		consulSrv = startConsul(d.consulLn, engine, d.consulSources, handler, d.guard, cert, limits.consul, log)
	}
	log.Info("serving", "address", ln.Addr().String(), "tls", cert != nil, "config", *f.config, "cluster", d.restCfg.Host, "kubeconfig", d.source,
		"resources", len(compiled.Of(d.plan).Resources), "version", version)

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
	time.Sleep(*f.shutdownDelay)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("HTTP drain incomplete", "error", err.Error())
	}
	if xdsSrv != nil {
		// ADS streams last: each connection gets GOAWAY(NO_ERROR) and
		// each stream ends UNAVAILABLE, so that its client reconnects
		// at once (to another replica), within what is left of the
		// shutdown's time, 2 s at least.
		deadline, _ := ctx.Deadline()
		xctx, xcancel := context.WithTimeout(context.Background(), max(time.Until(deadline), 2*time.Second))
		if err := xdsSrv.Shutdown(xctx); err != nil {
			log.Warn("xDS drain incomplete", "error", err.Error())
		}
		xcancel()
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
	ads := xds.New(engine.Inspect(), log.With("face", "xds"), handler.Registerer())
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

// connectionChecks makes client-go's HTTP/2 connections to the apiservers
// check themselves often enough for an apiserver that stops answering
// without closing the connection (a black hole) to be noticed well within
// staleAfter: by default a silent connection is pinged after 30 s and
// dropped 15 s later, so that a part would look current for 45 s longer
// than staleAfter promises. Here a connection silent for a quarter of
// staleAfter (at least 5 s) is pinged, and dropped when the ping is not
// answered in as long again. The environment's own
// HTTP2_READ_IDLE_TIMEOUT_SECONDS and HTTP2_PING_TIMEOUT_SECONDS win.
func connectionChecks(staleAfter time.Duration) {
	every := max(staleAfter/4, 5*time.Second)
	for _, name := range []string{"HTTP2_READ_IDLE_TIMEOUT_SECONDS", "HTTP2_PING_TIMEOUT_SECONDS"} {
		if _, set := os.LookupEnv(name); !set {
			os.Setenv(name, strconv.Itoa(int(every/time.Second)))
		}
	}
}
