package xds

import (
	"context"
	"errors"
	"io"
	gosync "sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
)

// The protocol over the seam alone (seam.go), without HTTP/2: a loop of
// the shape of go-control-plane's server, over a stream whose Recv
// blocks (grpc-go's, or one in memory), runs a Handler as the server's
// own transport does.

// loopStream is the Stream of serveLoop: a response is written by send
// at once; a wake is taken by the loop.
type loopStream struct {
	ctx  context.Context
	send func(msg []byte) error
	mu   gosync.Mutex
	wake Wakeup
	kick chan struct{} // one waiting at most
}

// Context is done once the loop ended.
func (l *loopStream) Context() context.Context { return l.ctx }

// Send writes msg (past the room left for gRPC's prefix) and calls
// written once it is.
func (l *loopStream) Send(msg []byte, written func()) error {
	if l.ctx.Err() != nil {
		return errGone
	}
	if err := l.send(msg[frameHeader:]); err != nil {
		return errGone
	}
	if written != nil {
		written()
	}
	return nil
}

// Wake adds w to what the loop takes next.
func (l *loopStream) Wake(w Wakeup) {
	l.mu.Lock()
	l.wake |= w
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// take takes the lowest wake asked for, or 0.
func (l *loopStream) take() Wakeup {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.wake & -l.wake
	l.wake &^= w
	return w
}

// serveLoop serves one stream with ads until it ends: recv blocks for
// the next request (io.EOF once the client ended its side), send writes
// a response. Requests and wakes are handled on the caller's goroutine,
// one at a time. It returns nil when the client ended the stream, else
// what ended it (a statusError of the protocol, ctx's error).
func serveLoop(ctx context.Context, ads protocol, p Peer, recv func() ([]byte, error), send func([]byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l := &loopStream{ctx: ctx, send: send, kick: make(chan struct{}, 1)}
	h, err := ads.open(l, p)
	if err != nil {
		return err
	}
	defer h.Close()
	reqs := make(chan []byte)
	ended := make(chan error, 1)
	go func() {
		for {
			m, err := recv()
			if err != nil {
				ended <- err
				return
			}
			select {
			case reqs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case m := <-reqs:
			err = h.Request(m)
		case <-l.kick:
			for w := l.take(); w != 0 && err == nil; w = l.take() {
				err = h.Wake(w)
			}
		case err = <-ended:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
		switch {
		case errors.Is(err, errGone):
			return ctx.Err()
		case err != nil:
			return err
		}
	}
}

// memStream is an ADS client in memory: the protocol of a Server runs
// over serveLoop, its requests and responses go through channels, as
// go-control-plane's messages.
type memStream struct {
	t     testing.TB
	reqs  chan []byte
	resps chan *discoveryv3.DiscoveryResponse
	fin   chan struct{} // closed once the stream ended, err why
	err   error
}

// openMem opens a stream of s for the caller p; it ends with the test.
func openMem(t testing.TB, s *Server, p Peer) *memStream {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	m := &memStream{t: t, reqs: make(chan []byte, 16), resps: make(chan *discoveryv3.DiscoveryResponse, 64), fin: make(chan struct{})}
	recv := func() ([]byte, error) {
		select {
		case b, ok := <-m.reqs:
			if !ok {
				return nil, io.EOF
			}
			return b, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	send := func(b []byte) error {
		r := &discoveryv3.DiscoveryResponse{}
		if err := proto.Unmarshal(b, r); err != nil {
			t.Errorf("a response that does not decode: %v", err)
			return err
		}
		select {
		case m.resps <- r:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	go func() {
		m.err = serveLoop(ctx, s, p, recv, send)
		close(m.fin)
	}()
	t.Cleanup(func() {
		stop()
		<-m.fin
	})
	return m
}

// send sends r.
func (m *memStream) send(r *discoveryv3.DiscoveryRequest) {
	m.t.Helper()
	b, err := proto.Marshal(r)
	if err != nil {
		m.t.Fatal(err)
	}
	m.raw(b)
}

// raw sends b as a request, whatever it holds.
func (m *memStream) raw(b []byte) { m.reqs <- b }

// recv waits up to d for a response; nil when none came.
func (m *memStream) recv(d time.Duration) *discoveryv3.DiscoveryResponse {
	select {
	case r := <-m.resps:
		return r
	case <-time.After(d):
		return nil
	}
}

// ended waits up to d for the stream's end, and reports what ended it
// (nil: the client did), or false when it did not end.
func (m *memStream) ended(d time.Duration) (bool, error) {
	select {
	case <-m.fin:
		return true, m.err
	case <-time.After(d):
		return false, nil
	}
}

// close ends the client's side.
func (m *memStream) close() { close(m.reqs) }
