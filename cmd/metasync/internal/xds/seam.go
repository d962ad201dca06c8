package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"
)

// The seam between a transport and the ADS protocol. A transport (the
// server's own HTTP/2, h2*.go; grpc-go's server in a test) carries
// streams and knows nothing of ADS; the protocol (stream.go, access.go,
// cache.go, status.go) knows nothing of HTTP/2. Each sees the other
// through the types below alone:
//
//	transport ──open(Stream, Peer)──▶ protocol  (once per stream: who it is, admitted or refused)
//	transport ──Handler─────────────▶ protocol  (its requests, its wakes, its end)
//	protocol  ──Stream──────────────▶ transport (its responses, a wake asked for)
//
// The protocol never waits on a stream: a transport calls a stream's
// Handler one call at a time, on a goroutine of its choosing (the
// server's own runs one only while there is something to do, none at
// rest), and the protocol asks for a turn with Stream.Wake. A transport
// whose streams block (grpc-go's Recv) runs a loop of its own over the
// same calls.

// Stream is one ADS stream as the protocol sees it, whatever carries it.
type Stream interface {
	// Context is done once the stream is gone (reset, its connection
	// ended): an access review under way for it stops.
	Context() context.Context
	// Send queues one DiscoveryResponse; it never waits on the client.
	// msg begins with frameHeader bytes that the transport may use
	// (gRPC's message prefix), the response after them, so that it is
	// written without a copy. written, when not nil, is called once
	// the response is written, not under the transport's locks. Send
	// returns errGone once the stream is gone.
	Send(msg []byte, written func()) error
	// Wake asks for a turn: the stream's Handler.Wake is called with
	// each of the bits of w, lowest first, one call at a time with its
	// other calls. It never waits; bits asked for again before their
	// turn are called once.
	Wake(w Wakeup)
}

// Peer is what the protocol knows of a stream's caller, told when the
// stream opens.
type Peer struct {
	// Addr is the client's address, host:port.
	Addr string
	// Authorization is the stream's "authorization" metadata ("" for
	// none).
	Authorization string
	// Conn is the connection as accepted (Listener's counts the
	// caller's streams on it), or nil.
	Conn net.Conn
}

// Handler is the protocol's side of one stream it admitted. A transport
// calls it one call at a time; an error ends the stream with it (see
// statusError; errGone ends it without a word), after which only Close
// is called.
type Handler interface {
	// Request handles one DiscoveryRequest, encoded, without gRPC's
	// prefix.
	Request(msg []byte) error
	// Wake handles a turn asked for with Stream.Wake.
	Wake(w Wakeup) error
	// Close lets go of what the stream holds; called once, whatever
	// ended it (the client, an error, a reset).
	Close()
}

// Wakeup is a set of reasons a protocol asks its stream for a turn.
type Wakeup uint8

// The protocol's reasons for a turn, in the order they are taken.
const (
	wakeFirst   Wakeup = 1 << iota // no request within Limits.FirstRequest
	wakeChanged                    // assignments it follows changed (client.pending)
	wakeAgain                      // access not told before: ask again
	wakeRecheck                    // the Authorizer is to be asked again
	wakeReload                     // a reload: targets may have come or gone
)

// errGone ends a stream that the client reset, or whose connection
// ended: nothing more is written to it.
var errGone = errors.New("the stream is gone")

// protocol is what a transport holds of the ADS protocol: its one door.
type protocol interface {
	// open admits a stream that p opened, or refuses it with a statusError (to end
	// it at once, with trailers alone). Who the caller is and what it
	// may hold is told here, and only here.
	open(st Stream, p Peer) (Handler, error)
	// watch tells the streams of what happens outside them (reloads,
	// access to ask again), until stop is closed.
	watch(stop <-chan struct{})
}

// Transport returns the transport of s, with TLS when tlsConfig is set.
func (s *Server) Transport(tlsConfig *tls.Config) *Transport {
	return newTransport(s, s.log, &s.connLog, tlsConfig)
}

// open is the protocol's door (see protocol): the Authorizer says who
// the caller is, before anything is sent (a stream without a valid token
// ends at once; a review that failed ends it UNAVAILABLE, and the
// client tries again), then the caller's limits take the stream's place.
func (s *Server) open(st Stream, p Peer) (Handler, error) {
	var user string
	var r *http.Request
	if s.authorize != nil {
		r, _ = http.NewRequestWithContext(st.Context(), http.MethodPost, "http://xds"+adsPath, nil)
		r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/2.0", 2, 0
		r.RemoteAddr = p.Addr
		if p.Authorization != "" {
			r.Header.Set("Authorization", p.Authorization)
		}
		u, code, msg := s.authorize(r, "")
		if code != 0 {
			s.refusedLog.Do(func() {
				s.log.Warn("xDS client refused", "remote", p.Addr, "status", code, "error", msg)
			})
			return nil, &statusError{codeOfHTTP(code), msg}
		}
		user = u
	}
	caller := callerOf(p.Addr, user)
	xc, _ := p.Conn.(*xconn)
	release, reason, msg := s.gate.admit(xc, caller)
	if reason != "" {
		s.refuse(reason, caller, msg)
		return nil, &statusError{codeResourceExhausted, msg}
	}
	c := s.newClient(st, r, user, caller)
	c.release = release
	if d := s.limits.FirstRequest; d > 0 {
		c.first = time.AfterFunc(d, func() { st.Wake(wakeFirst) })
	}
	return c, nil
}
