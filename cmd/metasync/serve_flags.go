package main

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"k8s.io/klog/v2"

	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/internal/tlsfiles"
	msync "github.com/iidp/metasync/sync"
)

// serveFlags are serve's flags, as parsed.
type serveFlags struct {
	config, listen, xdsListen, consulListen, consulServices *string
	kube                                                    kubeFlags
	logLevel                                                *string
	staleAfter, heartbeat, shutdownDelay                    *time.Duration
	snapshotDir                                             *string
	snapshotInterval                                        *time.Duration
	streamingList                                           listMode
	memoryLimit, auth, tlsCert, tlsKey                      *string
	authOpts                                                authOptions
	limitsOf                                                limitFlags
}

// parseServe reads serve's flags (and METASYNC_* variables for flags not
// given) and checks what needs nothing else: a usage error exits 2.
func parseServe(args []string, stderr io.Writer) (*serveFlags, error) {
	f := &serveFlags{}
	fs := newFlags("serve", stderr)
	f.config = fs.String("config", "", "config file (required)")
	f.kube = addKubeFlags(fs,
		"kubeconfig file (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)",
		"kubeconfig context (default: the current context)")
	f.listen = fs.String("listen", "", "HTTP listen address (default: the config's server.listen, 127.0.0.1:8080)")
	f.xdsListen = fs.String("xds-listen", "", "also serve xDS v3 (ADS, state of the world) on this address, for gRPC clients with xDS support: targets xds:///indexes/INDEX/KEY and xds:///chains/CHAIN/KEY (default: off); with --auth and TLS as the HTTP API: over TLS with --tls-cert-file, clients send bearer tokens with --auth=tokenreview, loopback only without --auth")
	f.consulListen = fs.String("consul-listen", "", "also serve the read side of the Consul HTTP API on this address (agent/self, catalog/services, catalog/service, health/service, with blocking queries), for Consul's discovery clients: a service is a key of a chain or index of --consul-services, its instances the key's host:port values (default: off); with --auth and TLS as the HTTP API: the token in X-Consul-Token or Authorization: Bearer with --auth=tokenreview, loopback only without --auth")
	f.consulServices = fs.String("consul-services", "", "with --consul-listen: the chains and indexes whose keys are Consul services, as chains/NAME[,indexes/NAME...]")
	f.logLevel = fs.String("log-level", "info", "log level: debug, info, warn or error")
	f.staleAfter = fs.Duration("stale-after", msync.DefaultStaleAfter, "a synced resource whose watch keeps failing this long is not ready")
	f.heartbeat = fs.Duration("stream-heartbeat", server.DefaultHeartbeat, "a change stream (?watch=true) that sent nothing this long gets a heartbeat frame")
	f.shutdownDelay = fs.Duration("shutdown-delay", 0, "on SIGTERM, fail /readyz this long before draining HTTP (let load balancers notice)")
	f.snapshotDir = fs.String("snapshot-dir", "", "write the indexes and each resource's resourceVersion here, and start warm from them: answers (marked stale) before the apiserver is reached, watches resumed without a list")
	f.snapshotInterval = fs.Duration("snapshot-interval", msync.DefaultSnapshotInterval, "with --snapshot-dir: how often to write the snapshot (also written at shutdown)")
	f.streamingList = listMode("false")
	fs.Var(&f.streamingList, "streaming-list", `=true (or the flag alone): list each resource as the apiserver streams it (a watch with sendInitialEvents) instead of a LIST; =auto: only the resources watched whole (no namespace, no label or field selector); =false: LIST. Measured: less apiserver memory when many daemons start at once and watch most of their resource's objects, as much or more when they watch a small part of a large resource, and more apiserver CPU and a longer first list (see docs/warm-start.md); LIST where the apiserver refuses it`)
	f.memoryLimit = fs.String("memory-limit", "auto", `the Go runtime's soft memory limit: "auto" (90 % of the container's cgroup memory limit, unless GOMEMLIMIT is set), "off", or a quantity such as 400Mi or 0.5Gi`)
	f.auth = fs.String("auth", "", `"tokenreview": require Kubernetes bearer tokens (TokenReview, SubjectAccessReview); "none": no authentication. Default: none on loopback; required beyond it`)
	f.authOpts = authOptions{
		audience:          fs.String("auth-audience", "", `with --auth=tokenreview: accept only tokens issued for this audience (projected service account tokens with "audience: NAME"); a token for the apiserver's own audience is refused with 401`),
		insecurePlaintext: fs.Bool("insecure-plaintext-auth", false, "allow --auth=tokenreview beyond loopback without TLS: callers' bearer tokens then cross the network in cleartext"),
	}
	f.tlsCert = fs.String("tls-cert-file", "", "serve HTTPS with the PEM certificate (chain) in this file, read again when it changes (with --tls-private-key-file)")
	f.tlsKey = fs.String("tls-private-key-file", "", "the PEM private key of --tls-cert-file, read again when it changes")
	f.limitsOf = addLimitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, exitError{2}
	}
	if err := envForFlags(fs, stderr); err != nil {
		return nil, err
	}
	if *f.config == "" || fs.NArg() > 0 {
		if a := fs.Arg(0); given(fs, "streaming-list") && new(listMode).Set(a) == nil {
			// "--streaming-list auto": a boolean flag takes its value
			// after "=" only, and the word is left over.
			fmt.Fprintf(stderr, "metasync serve: %q is not a flag's value here: write --streaming-list=%s\n", a, a)
			return nil, exitError{2}
		}
		fmt.Fprintln(stderr, "metasync serve: --config FILE is required, and nothing else")
		return nil, exitError{2}
	}
	for name, d := range map[string]time.Duration{"stream-heartbeat": *f.heartbeat, "stale-after": *f.staleAfter, "snapshot-interval": *f.snapshotInterval} {
		if d <= 0 {
			fmt.Fprintf(stderr, "metasync serve: --%s %v: must be positive\n", name, d)
			return nil, exitError{2}
		}
	}
	return f, nil
}

// setup makes the logger (client-go's lines go through it too), the
// limits (the fd budget shared by the listeners), the Go runtime's
// memory limit and the TLS certificate: what serve needs before it
// reads the config.
func (f *serveFlags) setup(stderr io.Writer) (log *slog.Logger, limits faceLimits, cert *tlsfiles.Certificate, err error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(*f.logLevel)); err != nil {
		fmt.Fprintf(stderr, "metasync serve: --log-level %q: %v\n", *f.logLevel, err)
		return nil, faceLimits{}, nil, exitError{2}
	}
	log = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	klog.SetSlogLogger(log.With("source", "client-go"))
	limits, err = f.limitsOf.limits(fdLimit(), *f.xdsListen != "", *f.consulListen != "", log)
	if err != nil {
		fmt.Fprintln(stderr, "metasync serve:", err)
		return nil, faceLimits{}, nil, exitError{2}
	}
	if err := setMemoryLimit(*f.memoryLimit, "/sys/fs/cgroup", log); err != nil {
		fmt.Fprintln(stderr, "metasync serve:", err)
		return nil, faceLimits{}, nil, exitError{2}
	}
	if (*f.tlsCert == "") != (*f.tlsKey == "") {
		fmt.Fprintln(stderr, "metasync serve: --tls-cert-file and --tls-private-key-file go together")
		return nil, faceLimits{}, nil, exitError{2}
	}
	if *f.tlsCert != "" {
		c, err := tlsfiles.NewCertificate(*f.tlsCert, *f.tlsKey, log)
		if err != nil {
			fmt.Fprintln(stderr, "metasync serve:", err)
			return nil, faceLimits{}, nil, exitError{2}
		}
		cert = c
	}
	f.authOpts.tls = cert != nil
	return log, limits, cert, nil
}
