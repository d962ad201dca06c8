package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	gosync "sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Transport serves s's ADS on the connections of a listener, each with
// the server's own HTTP/2 (h2.go): over TLS with HTTP/2 chosen by ALPN
// (as a bootstrap's "tls" channel credentials dial it), else unencrypted
// HTTP/2 (h2c, as "insecure" credentials dial it). A connection holds
// one goroutine at rest, its reader.
//
// A gRPC client holds one ADS stream on a connection: a connection
// carries at most 4, and one without a stream is closed after 30 s.
type Transport struct {
	ads protocol // what it carries: its one door to the protocol
	tls *tls.Config
	// log and connLog: the lines of connections in trouble (a few a
	// minute at most).
	log     *slog.Logger
	connLog *rate.Sometimes

	mu      gosync.Mutex
	lns     map[net.Listener]bool
	conns   map[net.Conn]bool
	h2      map[*h2conn]bool // the connections past their preface
	closed  bool
	watched bool
	stop    chan struct{}
	gone    chan struct{} // closed, and made anew, when a connection ends

	// blockBytes is the header blocks begun and not ended, of every
	// connection, at most maxBlocks (h2MaxBlockBytes when made).
	blockBytes atomic.Int64
	maxBlocks  int64
	// keepTime and keepTimeout: h2KeepaliveTime and
	// h2KeepaliveTimeout when made.
	keepTime, keepTimeout time.Duration
}

// handshakeTimeout bounds a TLS handshake; the HTTP/2 reader bounds the
// client's preface (10 s) and a connection without a stream (30 s).
const handshakeTimeout = 10 * time.Second

// newTransport returns a transport of ads, with TLS when tlsConfig is
// set, that logs to log within the budget connLog.
func newTransport(ads protocol, log *slog.Logger, connLog *rate.Sometimes, tlsConfig *tls.Config) *Transport {
	t := &Transport{
		ads:     ads,
		log:     log,
		connLog: connLog,
		lns:     map[net.Listener]bool{},
		conns:   map[net.Conn]bool{},
		h2:      map[*h2conn]bool{},
		stop:    make(chan struct{}),
		gone:    make(chan struct{}),

		maxBlocks:   h2MaxBlockBytes,
		keepTime:    h2KeepaliveTime,
		keepTimeout: h2KeepaliveTimeout,
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
	if !t.watched {
		t.watched = true
		go t.ads.watch(t.stop)
		go t.keepalive()
	}
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
	xc, _ := c.(*xconn)
	conn := c
	if t.tls != nil {
		tc := tls.Server(c, t.tls)
		_ = tc.SetDeadline(time.Now().Add(handshakeTimeout))
		if err := tc.Handshake(); err != nil {
			t.closeConn(c)
			return
		}
		if tc.ConnectionState().NegotiatedProtocol != "h2" {
			t.closeConn(c) // gRPC speaks HTTP/2 only
			return
		}
		_ = tc.SetDeadline(time.Time{})
		conn = tc
	}
	t.serveH2(conn, xc, c)
}

// closeConn closes an accepted connection and forgets it.
func (t *Transport) closeConn(c net.Conn) {
	c.Close()
	t.track(c, false)
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

// register counts c among the connections past their preface, or
// reports false once t is closed.
func (t *Transport) register(c *h2conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.h2[c] = true
	return true
}

// unregister forgets c, which ended.
func (t *Transport) unregister(c *h2conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.h2[c] {
		delete(t.h2, c)
		close(t.gone)
		t.gone = make(chan struct{})
	}
}

// keepalive PINGs the connections quiet for h2KeepaliveTime, and closes
// those whose PING went unanswered, until t is closed.
func (t *Transport) keepalive() {
	tick := time.NewTicker(t.keepTime / 6)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			t.mu.Lock()
			conns := make([]*h2conn, 0, len(t.h2))
			for c := range t.h2 {
				conns = append(conns, c)
			}
			t.mu.Unlock()
			for _, c := range conns {
				c.keepalive(now)
			}
		}
	}
}

// Shutdown stops accepting, and ends every connection gracefully: a
// GOAWAY(NO_ERROR), every open ADS stream ended with UNAVAILABLE (its
// client connects again, to another server when it knows one), then the
// connection closed once that is written. It waits for them until ctx
// is done, then closes what is left, as Close does.
func (t *Transport) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	if !t.closed {
		close(t.stop)
	}
	t.closed = true
	lns := t.lns
	t.lns = map[net.Listener]bool{}
	conns := make([]*h2conn, 0, len(t.h2))
	for c := range t.h2 {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	var err error
	for ln := range lns {
		err = errors.Join(err, ln.Close())
	}
	// Each connection's GOAWAY may wait on a client that does not read
	// (a second at most): they go together, not one after another.
	for _, c := range conns {
		go c.shutdown()
	}
	for waiting := true; waiting; {
		t.mu.Lock()
		left, gone := len(t.h2), t.gone
		t.mu.Unlock()
		if left == 0 {
			break
		}
		select {
		case <-gone:
		case <-ctx.Done():
			err = errors.Join(err, fmt.Errorf("%d xDS connections not ended in time: closed: %w", left, ctx.Err()))
			waiting = false
		}
	}
	return errors.Join(err, t.Close())
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
	if !t.closed {
		close(t.stop)
	}
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
