package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"log"
	"net"
	"net/http"
	"strings"
	gosync "sync"
	"time"

	"golang.org/x/net/http2"
)

// Transport serves s's ADS on the connections of a listener, each
// straight on an HTTP/2 server connection: over TLS with HTTP/2 chosen
// by ALPN (as a bootstrap's "tls" channel credentials dial it), else
// unencrypted HTTP/2 (h2c, as "insecure" credentials dial it). No HTTP/1
// server stands in between, so a connection holds no HTTP/1 read and
// write buffers: at 10,000 clients that is about 10 KiB a client.
//
// A gRPC client holds one ADS stream on a connection: a connection
// carries at most 4, and one without a stream is closed after 30 s.
type Transport struct {
	s   *Server
	tls *tls.Config
	//lint:ignore SA1019 see serveConn
	h2   *http2.Server
	base *http.Server // the limits the HTTP/2 server reads of it

	mu     gosync.Mutex
	lns    map[net.Listener]bool
	conns  map[net.Conn]bool
	closed bool
}

// handshakeTimeout bounds a TLS handshake; the HTTP/2 server bounds the
// client's preface (10 s) and a connection without a stream (30 s).
const handshakeTimeout = 10 * time.Second

// Transport returns the transport of s, with TLS when tlsConfig is set.
func (s *Server) Transport(tlsConfig *tls.Config) *Transport {
	t := &Transport{
		s: s,
		// ServeConn reads its idle timeout here alone (not of its
		// BaseConfig).
		//lint:ignore SA1019 see serveConn
		h2: &http2.Server{IdleTimeout: 30 * time.Second},
		base: &http.Server{MaxHeaderBytes: 64 << 10, HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 4},
			ErrorLog: log.New(connLog{s}, "", 0)},
		lns:   map[net.Listener]bool{},
		conns: map[net.Conn]bool{},
	}
	if tlsConfig != nil {
		t.tls = tlsConfig.Clone()
		t.tls.NextProtos = []string{"h2"}
	}
	return t
}

// Serve accepts connections on ln (s.Listener's, to count them against
// the limits) and serves each, until t is closed: then it returns
// http.ErrServerClosed.
func (t *Transport) Serve(ln net.Listener) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return http.ErrServerClosed
	}
	t.lns[ln] = true
	t.mu.Unlock()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if t.isClosed() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of descriptors, or a connection reset before it
				// was accepted: wait and try again, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		if !t.track(c, true) {
			c.Close()
			return http.ErrServerClosed
		}
		go t.serveConn(c)
	}
}

// isTemporary reports whether an accept error is worth retrying.
func isTemporary(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

// serveConn serves one connection until it ends.
func (t *Transport) serveConn(c net.Conn) {
	defer func() {
		c.Close()
		t.track(c, false)
	}()
	xc, _ := c.(*xconn)
	conn := c
	if t.tls != nil {
		tc := tls.Server(c, t.tls)
		_ = tc.SetDeadline(time.Now().Add(handshakeTimeout))
		if err := tc.Handshake(); err != nil {
			return
		}
		if tc.ConnectionState().NegotiatedProtocol != "h2" {
			return // gRPC speaks HTTP/2 only
		}
		_ = tc.SetDeadline(time.Time{})
		conn = tc
	}
	ctx := context.Background()
	if xc != nil {
		ctx = context.WithValue(ctx, connKey{}, xc)
	}
	// ServeConn is deprecated for http.Server.Serve, which would put
	// net/http's HTTP/1 server, its read and write buffers and its state,
	// in front of every connection for its whole life: about 9 KiB a
	// client, measured (BENCHMARKS.md, "What a client costs").
	//lint:ignore SA1019 the only API that serves an accepted connection as HTTP/2 alone
	t.h2.ServeConn(conn, &http2.ServeConnOpts{Context: ctx, BaseConfig: t.base, Handler: t.s})
}

// track adds (or, with add false, removes) a connection; adding fails
// once t is closed.
func (t *Transport) track(c net.Conn, add bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !add {
		delete(t.conns, c)
		return true
	}
	if t.closed {
		return false
	}
	t.conns[c] = true
	return true
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// Close stops accepting and closes every connection: their streams end
// and their clients reconnect (to another server, when they know one).
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	lns, conns := t.lns, t.conns
	t.lns, t.conns = map[net.Listener]bool{}, map[net.Conn]bool{}
	t.mu.Unlock()
	var err error
	for ln := range lns {
		err = errors.Join(err, ln.Close())
	}
	for c := range conns {
		c.Close()
	}
	return err
}

// connLog takes what the HTTP/2 server says of a connection (a client
// that sent garbage, a flood of frames it ended) into the daemon's log,
// at most a few lines a minute: one line per bad connection would be
// the attacker's to write.
type connLog struct{ s *Server }

func (l connLog) Write(p []byte) (int, error) {
	l.s.connLog.Do(func() {
		l.s.log.Warn("xDS connection trouble (a few such lines a minute at most)", "detail", strings.TrimSpace(string(p)))
	})
	return len(p), nil
}
