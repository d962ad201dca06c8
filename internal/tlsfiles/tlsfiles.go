// Package tlsfiles serves and dials TLS from PEM files that change while
// the process runs: a server's certificate and private key, rotated in
// place (as cert-manager does, through the kubelet's symlink swap of a
// Secret volume), and the CA certificates a client verifies its server
// against. Nothing is cached for longer than a second (the server's pair)
// or one connection (the client's CA certificates), so that a rotation
// needs no restart.
package tlsfiles

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CheckEvery is how often, at most, a Certificate reads its files again:
// at a handshake, when the last look is older than this.
const CheckEvery = time.Second

// maxPEM bounds what is read of a certificate, key or CA file: a path
// that points at a device or a pipe must not fill the memory.
const maxPEM = 1 << 20

// Certificate is a server's certificate chain and private key, from two
// PEM files that may be replaced while it serves. Its GetCertificate,
// used by every handshake, reads the files again when it last looked more
// than CheckEvery ago; when their content changed and the new pair is
// valid, the new pair answers from that handshake on (logged); a pair that
// does not load (a key that does not match, a file half written) is logged
// once, and the last good pair keeps answering.
type Certificate struct {
	certFile, keyFile string
	log               *slog.Logger
	every             time.Duration

	mu      sync.Mutex
	cert    *tls.Certificate
	loaded  []byte // the files' content of cert: certificate, then key
	refused []byte // the content last refused, logged once
	readErr string // the last error reading the files, logged once
	// pending is the content read at the last look, changed from the
	// pair served: it is taken only if the next look reads it again.
	pending  []byte
	lastLook time.Time
}

// NewCertificate loads the pair of certFile and keyFile, or says why it
// cannot (a server must not start without a certificate).
func NewCertificate(certFile, keyFile string, log *slog.Logger) (*Certificate, error) {
	c := &Certificate{certFile: certFile, keyFile: keyFile, log: log, every: CheckEvery}
	content, cert, err := c.read()
	if err != nil {
		return nil, err
	}
	if err := current(cert, time.Now()); err != nil {
		log.Warn("TLS certificate served although it is not valid now: clients will refuse it", "cert", certFile, "error", err.Error())
	}
	c.cert, c.loaded, c.lastLook = cert, content, time.Now()
	return c, nil
}

// current says why a pair's leaf certificate is not valid at now, or nil.
func current(cert *tls.Certificate, now time.Time) error {
	switch leaf := cert.Leaf; {
	case leaf == nil:
		return nil
	case now.After(leaf.NotAfter):
		return fmt.Errorf("it expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("it is valid from %s only", leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// complete checks that every PEM block of a file was read whole: a file
// cut short (written in place, not renamed into place) may end with the
// beginning of a block, which tls.X509KeyPair skips without a word,
// serving a chain without its intermediate.
func complete(path string, b []byte) error {
	rest := b
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
	}
	if bytes.Contains(rest, []byte("-----BEGIN")) || bytes.HasPrefix(bytes.TrimSpace(rest), []byte("-")) {
		return fmt.Errorf("%s ends with a PEM block cut short (a file half written?)", path)
	}
	return nil
}

// read reads both files and parses them as a pair.
func (c *Certificate) read() ([]byte, *tls.Certificate, error) {
	certPEM, err := readPEM(c.certFile)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := readPEM(c.keyFile)
	if err != nil {
		return nil, nil, err
	}
	content := append(append(certPEM, 0), keyPEM...)
	if err := errors.Join(complete(c.certFile, certPEM), complete(c.keyFile, keyPEM)); err != nil {
		return content, nil, fmt.Errorf("TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return content, nil, fmt.Errorf("TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	return content, &cert, nil
}

// GetCertificate is for tls.Config.GetCertificate: the current pair, read
// again first if the last look is older than CheckEvery.
func (c *Certificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.lastLook) >= c.every {
		c.lastLook = time.Now()
		c.reload()
	}
	return c.cert, nil
}

// reload reads the files and takes their pair when it changed and loads.
// c.mu is held.
//
// A pair that is not valid now (expired, or not yet valid) does not
// replace one that is: it is refused as a pair that does not load is.
// Each refusal is logged once: a file that cannot be read once per error,
// a pair that does not load once per content.
//
// Changed files are taken only once two looks, CheckEvery apart, have
// read the same content: a file written in place (not renamed into
// place, as the kubelet does) can be read between two of its writes, and
// a chain cut between its certificates is a valid chain of fewer.
func (c *Certificate) reload() {
	content, cert, err := c.read()
	if content != nil && !bytes.Equal(content, c.loaded) && !bytes.Equal(content, c.pending) {
		c.pending = content
		return
	}
	c.pending = nil
	if err == nil && current(c.cert, time.Now()) == nil {
		if why := current(cert, time.Now()); why != nil {
			err = fmt.Errorf("TLS certificate %s: %w", c.certFile, why)
		}
	}
	switch {
	case content != nil && bytes.Equal(content, c.loaded):
		c.refused, c.readErr = nil, ""
	case err != nil && content == nil:
		if err.Error() != c.readErr {
			c.log.Warn("TLS certificate not reloaded: serving the last good one", "error", err.Error(), "not_after", leafNotAfter(c.cert))
		}
		c.readErr = err.Error()
	case err != nil:
		if !bytes.Equal(content, c.refused) {
			c.log.Warn("TLS certificate not reloaded: serving the last good one", "error", err.Error(), "not_after", leafNotAfter(c.cert))
		}
		c.refused, c.readErr = content, ""
	default:
		c.cert, c.loaded, c.refused, c.readErr = cert, content, nil, ""
		c.log.Info("TLS certificate reloaded", "cert", c.certFile, "not_after", leafNotAfter(cert))
	}
}

// NotAfter is when the certificate now served expires.
func (c *Certificate) NotAfter() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return leafNotAfter(c.cert)
}

// Collector is the gauge metasync_tls_certificate_not_after_timestamp_seconds:
// when the certificate now served expires (an alert can tell a renewal
// that never reached the daemon).
func (c *Certificate) Collector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "metasync_tls_certificate_not_after_timestamp_seconds",
		Help: "When the TLS certificate that the HTTP API serves expires (Unix time); it changes when a renewed certificate is read.",
	}, func() float64 { return float64(c.NotAfter().Unix()) })
}

// leafNotAfter is the expiry of a pair's first certificate.
func leafNotAfter(cert *tls.Certificate) time.Time {
	if cert == nil || cert.Leaf == nil {
		return time.Time{}
	}
	return cert.Leaf.NotAfter
}

// ServerConfig is the TLS configuration of an HTTP server that answers
// with c: TLS 1.2 or later, HTTP/1.1 only (every stream keeps its own
// connection, as over plain HTTP).
func (c *Certificate) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: c.GetCertificate,
		NextProtos:     []string{"http/1.1"},
	}
}

// readPEM reads a PEM file, at most maxPEM bytes of it. A path that is no
// regular file (a pipe would block the open) is refused before it is
// opened.
func readPEM(path string) ([]byte, error) {
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPEM+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxPEM {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a PEM file", path, maxPEM)
	}
	return b, nil
}

// CAPool reads the PEM certificates of caFile into a pool, or says why it
// cannot (no file, no certificate in it).
func CAPool(caFile string) (*x509.CertPool, error) {
	b, err := readPEM(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
	}
	return pool, nil
}

// DialTLS returns a dial function for http.Transport.DialTLSContext that
// verifies the server's certificate against the CA certificates of caFile,
// read again at each connection (so that a rotated CA is picked up), or
// against the system's roots when caFile is "". The certificate must name
// serverName, or, when serverName is "", the host dialled.
func DialTLS(caFile, serverName string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg, err := ClientConfig(caFile, serverName)
		if err != nil {
			return nil, err
		}
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			cfg.ServerName = host
		}
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}, Config: cfg}
		return d.DialContext(ctx, network, addr)
	}
}

// ClientConfig is the TLS configuration of one connection to a daemon:
// the CA certificates of caFile read now (the system's roots when ""),
// the server name to verify (the host dialled when ""), TLS 1.2 or later,
// HTTP/1.1.
func ClientConfig(caFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, NextProtos: []string{"http/1.1"}}
	if caFile != "" {
		pool, err := CAPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// Transport is an http.Transport whose https:// connections are made by
// DialTLS(caFile, serverName); http:// ones are plain, as ever. Through
// an HTTPS proxy (HTTPS_PROXY), where DialTLS is not used, the daemon is
// verified against the CA certificates as they were read here (the
// system's roots, and so a refusal, if they could not be).
func Transport(caFile, serverName string) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialTLSContext = DialTLS(caFile, serverName)
	t.ForceAttemptHTTP2 = false
	if cfg, err := ClientConfig(caFile, serverName); err == nil {
		t.TLSClientConfig = cfg
	}
	return t
}
