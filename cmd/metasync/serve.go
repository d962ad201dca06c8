package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	compiled "github.com/iidp/metasync/internal/plan"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/iidp/metasync/internal/api"
	"github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/schema/cluster"
	msync "github.com/iidp/metasync/sync"
)

// envForFlags sets every flag that was not given on the command line from
// its METASYNC_ variable (METASYNC_ + the flag's name in upper snake case),
// so that flags > environment.
func envForFlags(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := "METASYNC_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	})
	return err
}

func serve(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", stderr)
	config := fs.String("config", "", "config file (required)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)")
	kubecontext := fs.String("context", "", "kubeconfig context (default: the current context)")
	listen := fs.String("listen", "", "HTTP listen address (default: the config's server.listen, 127.0.0.1:8080)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	staleAfter := fs.Duration("stale-after", msync.DefaultStaleAfter, "a synced resource whose watch keeps failing this long is not ready")
	shutdownDelay := fs.Duration("shutdown-delay", 0, "on SIGTERM, fail /readyz this long before draining HTTP (let load balancers notice)")
	auth := fs.String("auth", "", `"tokenreview": require Kubernetes bearer tokens (TokenReview, SubjectAccessReview); "none": no authentication. Default: none on loopback; required beyond it`)
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	if err := envForFlags(fs); err != nil {
		fmt.Fprintln(stderr, "metasync serve:", err)
		return exitError{2}
	}
	if *config == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "metasync serve: --config FILE is required, and nothing else")
		return exitError{2}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "metasync serve: --log-level %q: %v\n", *logLevel, err)
		return exitError{2}
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	klog.SetSlogLogger(log.With("source", "client-go"))

	flags := map[string]any{}
	if *listen != "" {
		flags["server.listen"] = *listen
	}
	plan, err := schema.LoadPlan(*config, schema.LoadOptions{Environ: os.Environ(), Flags: flags})
	if err != nil {
		problems := schema.Problems(err)
		for _, p := range problems {
			fmt.Fprintln(stderr, p)
		}
		log.Error("invalid config: nothing started", "config", *config, "problems", len(problems))
		return exitError{1}
	}
	restCfg, source, err := restConfig(*kubeconfig, *kubecontext)
	if err != nil {
		log.Error("no cluster to talk to", "error", err.Error())
		return exitError{1}
	}
	if len(plan.CRDs()) > 0 {
		if err := installCRDs(plan, restCfg, log); err != nil {
			for _, p := range schema.Problems(err) {
				fmt.Fprintln(stderr, p)
			}
			log.Error("CRDs not installed: nothing started", "error", err.Error())
			return exitError{1}
		}
	}
	engine, err := msync.New(plan, restCfg, msync.Options{Logger: log, StaleAfter: *staleAfter})
	if err != nil {
		log.Error("engine", "error", err.Error())
		return exitError{1}
	}
	addr := plan.Server().Listen
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("listen", "address", addr, "error", err.Error())
		return exitError{1}
	}
	var guard *api.TokenAuth
	host, _, _ := net.SplitHostPort(addr)
	switch *auth {
	case "tokenreview":
		kube, err := kubernetes.NewForConfig(reviewConfig(restCfg))
		if err != nil {
			log.Error("auth", "error", err.Error())
			return exitError{1}
		}
		guard = api.NewTokenAuth(kube, log)
	case "none":
		if !isLoopback(host) {
			log.Warn("the HTTP API listens beyond loopback without authentication, as --auth=none asks", "address", addr)
		}
	case "":
		if !isLoopback(host) {
			ln.Close()
			log.Error("listening beyond loopback needs --auth=tokenreview (or --auth=none to serve without authentication on purpose)", "address", addr)
			return exitError{1}
		}
	default:
		ln.Close()
		log.Error(`--auth must be "tokenreview" or "none"`, "auth", *auth)
		return exitError{1}
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	handler := api.New(engine, log)
	srv := handler.HTTPServer(addr, log, guard)
	engineCtx, stopEngine := context.WithCancel(context.Background())
	engineDone := make(chan struct{})
	go func() {
		defer close(engineDone)
		_ = engine.Start(engineCtx)
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	go reportProgress(engineCtx, engine, log)
	log.Info("serving", "address", ln.Addr().String(), "config", *config, "cluster", restCfg.Host, "kubeconfig", source,
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
	stopEngine()
	select {
	case <-engineDone:
	case <-ctx.Done():
		log.Warn("watches did not stop in time")
	}
	log.Info("stopped")
	return nil
}

// installCRDs checks the config's paths against the CRD files it lists,
// installs them and waits until each is established.
func installCRDs(plan *schema.Plan, cfg *rest.Config, log *slog.Logger) error {
	crds, err := schema.ReadCRDs(plan.CRDs())
	if err != nil {
		return err
	}
	notes, err := schema.CheckPaths(plan, crds)
	for _, n := range notes {
		log.Info("path check", "note", n)
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	if err := cluster.InstallCRDs(ctx, cfg, crds, 60*time.Second); err != nil {
		return err
	}
	names := make([]string, len(crds))
	for i, c := range crds {
		names[i] = c.Name
	}
	log.Info("CRDs installed and established", "crds", names, "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// The review client's rate limits: its own, so that reviews never wait
// behind the watches (nor the other way round), and well above client-go's
// default 5 QPS, which a single caller looking up a few indexes exhausts.
const (
	reviewQPS   = 50
	reviewBurst = 100
)

// reviewConfig is the rest.Config of the TokenReview and
// SubjectAccessReview client: a copy of cfg with a rate limiter of its own.
func reviewConfig(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst, c.RateLimiter = reviewQPS, reviewBurst, nil
	c.UserAgent = rest.DefaultKubernetesUserAgent() + " metasync-auth"
	return c
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// restConfig finds the cluster: --kubeconfig, then $KUBECONFIG, then
// in-cluster, then ~/.kube/config. It returns where the config came from.
func restConfig(path, context string) (*rest.Config, string, error) {
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	load := func(rules *clientcmd.ClientConfigLoadingRules) (*rest.Config, error) {
		return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	}
	switch {
	case path != "":
		cfg, err := load(&clientcmd.ClientConfigLoadingRules{ExplicitPath: path})
		return cfg, path, err
	case os.Getenv("KUBECONFIG") != "":
		files := filepath.SplitList(os.Getenv("KUBECONFIG"))
		cfg, err := load(&clientcmd.ClientConfigLoadingRules{Precedence: files})
		return cfg, strings.Join(files, string(filepath.ListSeparator)) + " (from KUBECONFIG)", err
	}
	if context == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, "in-cluster", nil
		}
	}
	home := clientcmd.RecommendedHomeFile
	if _, err := os.Stat(home); err != nil {
		return nil, "", errors.New("no kubeconfig: give --kubeconfig, set KUBECONFIG, run in a pod, or create " + home)
	}
	cfg, err := load(&clientcmd.ClientConfigLoadingRules{ExplicitPath: home})
	return cfg, home, err
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

var _ http.Handler = (*api.Server)(nil)
