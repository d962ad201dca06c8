package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/cmd/metasync/internal/consul"
	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/internal/tlsfiles"
	msync "github.com/iidp/metasync/sync"
)

// consulFlags checks serve's Consul flags: --consul-listen and
// --consul-services go together, each source is a chain or index of the
// config (the limits are checked with the others, see consulLimits). It
// returns the sources.
func consulFlags(listen, services string, e *msync.Engine, stderr io.Writer) ([]consul.Source, error) {
	if listen == "" || services == "" {
		fmt.Fprintln(stderr, "metasync serve: --consul-listen and --consul-services go together: the address, and the chains or indexes whose keys are services (chains/NAME[,indexes/NAME...])")
		return nil, exitError{2}
	}
	sources, err := consul.ParseSources(services)
	if err != nil {
		fmt.Fprintf(stderr, "metasync serve: --consul-services: %v\n", err)
		return nil, exitError{2}
	}
	var problems []error
	for _, src := range sources {
		if src.Kind == "chains" && !e.Inspect().HasChain(src.Name) || src.Kind == "indexes" && !e.Inspect().HasIndex(src.Name) {
			what := "index"
			if src.Kind == "chains" {
				what = "chain"
			}
			problems = append(problems, fmt.Errorf("%s: the config has no such %s", src, what))
		}
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "metasync serve: --consul-services: %v\n", errors.Join(problems...))
		return nil, exitError{2}
	}
	return sources, nil
}

// startConsul serves the Consul facade of sources on ln, with the limits
// l (its connections limited by its Listener), until its
// server shuts down: its metrics in the HTTP API's registry, and with a
// guard each caller's token and access checked as for the HTTP lookups
// of the chains and indexes behind a service.
func startConsul(ln net.Listener, engine *msync.Engine, sources []consul.Source, handler *server.Server, guard *auth.TokenAuth, cert *tlsfiles.Certificate, l consul.Limits, log *slog.Logger) *http.Server {
	c := consul.New(engine.Inspect(), sources, log.With("face", "consul"), handler.Registerer())
	c.SetLimits(l)
	if guard != nil {
		c.SetAuthorizer(guard.Check)
	}
	var tlsConfig *tls.Config
	if cert != nil {
		tlsConfig = cert.ServerConfig()
	}
	srv := c.HTTPServer(tlsConfig, log)
	ln = c.Listener(ln)
	go func() {
		var err error
		if cert != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("Consul facade failed", "error", err.Error())
		}
	}()
	log.Info("serving the Consul API", "address", ln.Addr().String(), "services", fmt.Sprint(sources), "tls", cert != nil, "auth", guard != nil)
	return srv
}
