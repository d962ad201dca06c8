package main

import (
	"log/slog"
	"net"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
)

// authOptions are the flags that go with --auth: --auth-audience and
// --insecure-plaintext-auth; tls is whether serve serves HTTPS.
type authOptions struct {
	audience          *string
	insecurePlaintext *bool
	tls               bool
}

// authFor is the HTTP API's authentication, as --auth (mode) asks for the
// listen address addr: "tokenreview" checks bearer tokens against the
// cluster of cfg (TokenReview, SubjectAccessReview), for o.audience if
// set; beyond loopback it needs TLS, or --insecure-plaintext-auth to send
// bearer tokens in cleartext on purpose. "none" checks nothing, with a
// warning beyond loopback; "" checks nothing on loopback and is refused
// beyond it. A nil *auth.TokenAuth means no authentication. A refusal is
// logged and returned as exitError{1}.
func authFor(mode, addr string, o authOptions, cfg *rest.Config, log *slog.Logger) (*auth.TokenAuth, error) {
	host, _, _ := net.SplitHostPort(addr)
	if mode != "tokenreview" && (*o.audience != "" || *o.insecurePlaintext) {
		log.Error("--auth-audience and --insecure-plaintext-auth go with --auth=tokenreview", "auth", mode)
		return nil, exitError{1}
	}
	switch mode {
	case "tokenreview":
		switch {
		case o.tls && *o.insecurePlaintext:
			log.Error("--insecure-plaintext-auth with TLS (--tls-cert-file): choose one")
			return nil, exitError{1}
		case !o.tls && !isLoopback(host) && !*o.insecurePlaintext:
			log.Error("--auth=tokenreview beyond loopback needs TLS (--tls-cert-file and --tls-private-key-file), or --insecure-plaintext-auth to let callers send their bearer tokens in cleartext on purpose", "address", addr)
			return nil, exitError{1}
		case !o.tls && !isLoopback(host):
			log.Warn("callers' bearer tokens cross the network in cleartext, as --insecure-plaintext-auth asks", "address", addr)
		}
		if *o.audience == "" && !isLoopback(host) {
			log.Warn("without --auth-audience, callers send tokens that the apiserver accepts too: give them projected tokens of an audience of metasync's own and set --auth-audience", "address", addr)
		}
		guard, err := auth.NewTokenAuth(reviewConfig(cfg), log)
		if err != nil {
			log.Error("auth", "error", err.Error())
			return nil, exitError{1}
		}
		guard.SetAudience(*o.audience)
		return guard, nil
	case "none":
		if !isLoopback(host) {
			log.Warn("the HTTP API listens beyond loopback without authentication, as --auth=none asks", "address", addr)
		}
		return nil, nil
	case "":
		if !isLoopback(host) {
			log.Error("listening beyond loopback needs --auth=tokenreview (or --auth=none to serve without authentication on purpose)", "address", addr)
			return nil, exitError{1}
		}
		return nil, nil
	default:
		log.Error(`--auth must be "tokenreview" or "none"`, "auth", mode)
		return nil, exitError{1}
	}
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

// isLoopback reports whether host (an address's host, without the port)
// is "localhost" or a loopback IP.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
