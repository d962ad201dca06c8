package xds

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// The events of a stream, which its goroutine handles one at a time.
const (
	evOpen    = 1 << iota // its headers came
	evChanged             // assignments it follows changed (client.pending)
	evAgain               // access not told before: ask again
	evRecheck             // the Authorizer is to be asked again
	evReload              // a reload: targets may have come or gone
	evFirst               // no request within Limits.FirstRequest
	evEOF                 // the client ended its side
	evFail                // a request that cannot be read (recvErr)
	evGone                // reset, or its connection ended
)

// errGone ends a stream that the client reset, or whose connection
// ended: nothing more is written to it.
var errGone = errors.New("the stream is gone")

// h2stream is one ADS stream. No goroutine is its own at rest: run
// handles its events, one at a time, in a goroutine started when one
// comes and ended when none is left; and while a response it sent waits
// to be written, it handles none but its end (its requests wait, and
// hold their flow-control credit: a client that does not read cannot
// make it queue more). Its protocol state (client) is run's alone.
type h2stream struct {
	c  *h2conn
	id uint32

	// Under c.mu.
	req        *headerFields // the request's headers, until opened
	sendWindow int64
	recvWindow int32
	head, tail []byte   // the response's headers, its trailers
	out        []outMsg // messages to write, in order
	off        int      // of out[0] written
	rst        uint32   // a RST_STREAM to write
	timer      *time.Timer
	reqs       []queuedReq
	recvErr    error
	msgTimer   *time.Timer // a message begun, to be whole within messageTimeout
	ev         int
	running    bool
	remoteDone bool // the client ended its side
	reset      bool // reset, or its connection ended: nothing more is written
	finished   bool // ended: its state is let go, what is queued is written

	// The reader's own: the message being read.
	msg  []byte
	need int // its length, once its prefix is read

	// run's own.
	cl         *client
	release    func()
	cancel     context.CancelFunc
	first      *time.Timer
	gotRequest bool
	cleaned    bool
}

// outMsg is a gRPC message to write, of the short type kind.
type outMsg struct {
	b    []byte
	kind string
}

// queuedReq is a request read and not handled yet, with the stream's
// flow-control credit it holds back.
type queuedReq struct {
	r      request
	credit int32
}

// gone reports whether nothing more is to be read or written (under
// c.mu).
func (st *h2stream) gone() bool { return st.reset || st.finished }

// idleLocked reports whether nothing of the stream waits to be written.
func (st *h2stream) idleLocked() bool {
	return st.head == nil && st.tail == nil && st.rst == 0 && len(st.out) == 0
}

// dropOutputLocked forgets what waits to be written (a reset to write
// stays).
func (st *h2stream) dropOutputLocked() {
	st.head, st.tail, st.out, st.off = nil, nil, nil, 0
	if st.timer != nil {
		st.timer.Stop()
	}
	if st.msgTimer != nil {
		st.msgTimer.Stop()
		st.msgTimer = nil
	}
}

// signalLocked adds events and reports whether run is to start (under
// c.mu; start it with start).
func (st *h2stream) signalLocked(ev int) bool {
	st.ev |= ev
	if st.running || !st.runnableLocked() {
		return false
	}
	st.running = true
	return true
}

func (st *h2stream) runnableLocked() bool {
	if st.ev&evGone != 0 {
		return true
	}
	if st.finished || !st.idleLocked() {
		return false
	}
	return st.ev != 0 || len(st.reqs) > 0
}

// signal adds events from outside the connection's goroutines.
func (st *h2stream) signal(ev int) {
	st.c.mu.Lock()
	start := st.signalLocked(ev)
	st.c.mu.Unlock()
	st.start(start)
}

func (st *h2stream) start(start bool) {
	if start {
		go st.run()
	}
}

// run handles the stream's events until none is left that can be
// handled now.
func (st *h2stream) run() {
	c := st.c
	for {
		c.mu.Lock()
		job, q, has := st.nextLocked()
		startW := false
		if has && q.credit > 0 && !st.remoteDone && !st.gone() {
			// The request is taken: the client may send as much again.
			c.ctrl = windowFrame(c.ctrl, st.id, uint32(q.credit))
			st.recvWindow += q.credit
			startW = c.kickLocked()
		}
		if job == 0 && !has {
			st.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.startWriter(startW)
		st.handle(job, q, has)
	}
}

// nextLocked takes the next event to handle: the end first; else, when
// nothing waits to be written, the opening, the requests in order, and
// then the rest.
func (st *h2stream) nextLocked() (job int, q queuedReq, has bool) {
	if st.ev&evGone != 0 {
		st.ev &^= evGone
		return evGone, q, false
	}
	if st.finished || !st.idleLocked() {
		return 0, q, false
	}
	if st.ev&evOpen != 0 {
		st.ev &^= evOpen
		return evOpen, q, false
	}
	if len(st.reqs) > 0 {
		q = st.reqs[0]
		st.reqs[0] = queuedReq{}
		if st.reqs = st.reqs[1:]; len(st.reqs) == 0 {
			st.reqs = nil
		}
		return 0, q, true
	}
	for _, ev := range [...]int{evFail, evEOF, evFirst, evChanged, evAgain, evRecheck, evReload} {
		if st.ev&ev != 0 {
			st.ev &^= ev
			return ev, q, false
		}
	}
	return 0, q, false
}

// handle handles one event.
func (st *h2stream) handle(job int, q queuedReq, has bool) {
	c := st.c
	if job == evGone {
		st.cleanup()
		c.mu.Lock()
		st.finished = true
		st.reqs = nil
		if st.idleLocked() {
			c.removeLocked(st)
		}
		c.mu.Unlock()
		return
	}
	if job == evOpen {
		st.open()
		return
	}
	cl := st.cl
	if cl == nil {
		return
	}
	s := cl.s
	var err error
	switch {
	case has:
		if st.first != nil {
			st.first.Stop()
			st.first = nil
		}
		st.gotRequest = true
		err = cl.request(q.r)
	case job == evFail:
		c.mu.Lock()
		err = st.recvErr
		c.mu.Unlock()
	case job == evEOF:
		err = io.EOF
	case job == evFirst:
		if !st.gotRequest {
			msg := "no DiscoveryRequest within " + s.limits.FirstRequest.String() + " of the stream's start"
			s.refuse(refusedFirstRequest, cl.caller, msg)
			err = &statusError{codeDeadlineExceeded, msg}
		}
	case job == evChanged:
		err = cl.pushPending()
	case job == evAgain:
		err = cl.pushChanged()
	case job == evRecheck:
		// The token may have gone, access may have been taken away (or
		// granted): answers are built again, and what changed is sent.
		if _, code, msg := s.authorize(cl.req, ""); code == http.StatusUnauthorized {
			err = &statusError{codeUnauthenticated, msg}
		} else {
			err = cl.pushChanged()
		}
	case job == evReload:
		// Targets a reload added or brought back: Listeners and
		// Clusters are answered anew (the cache restarted their
		// entries).
		err = cl.pushChanged()
	}
	if err != nil {
		st.end(err)
	}
}

// end ends the stream for err: io.EOF ends it OK, a statusError with its
// status, errGone without a word (it is gone), any other INTERNAL.
func (st *h2stream) end(err error) {
	code, message := codeOK, ""
	var se *statusError
	switch {
	case errors.Is(err, errGone):
		st.finish(nil)
		return
	case errors.Is(err, io.EOF):
	case errors.As(err, &se):
		code, message = se.code, se.message
	default:
		code, message = codeInternal, err.Error()
	}
	st.finish(trailers(false, code, message))
}

// finish lets the stream's state go and writes tail, the block that ends
// it, after what it sent; nil writes nothing more.
func (st *h2stream) finish(tail []byte) {
	st.cleanup()
	c := st.c
	c.mu.Lock()
	st.finished = true
	st.reqs = nil
	if !st.reset && tail != nil {
		st.tail = tail
	}
	if st.idleLocked() {
		c.removeLocked(st)
	}
	start := c.kickLocked()
	c.mu.Unlock()
	c.startWriter(start)
}

// cleanup lets go of what the stream holds: its client's state and
// entries, its place in the limits, its timers.
func (st *h2stream) cleanup() {
	if st.cleaned {
		return
	}
	st.cleaned = true
	if st.first != nil {
		st.first.Stop()
	}
	if st.cl != nil {
		st.cl.close()
	}
	if st.release != nil {
		st.release()
	}
	if st.cancel != nil {
		st.cancel()
	}
	c := st.c
	c.mu.Lock()
	if st.timer != nil {
		st.timer.Stop()
	}
	if st.msgTimer != nil {
		st.msgTimer.Stop()
		st.msgTimer = nil
	}
	c.mu.Unlock()
}

// open answers the stream's headers: a refusal ends it at once (a
// response of trailers alone), else its response begins and its client
// state is made.
func (st *h2stream) open() {
	c := st.c
	s := c.t.s
	c.mu.Lock()
	h := st.req
	st.req = nil
	c.mu.Unlock()
	ct := h.contentType
	if h.method != http.MethodPost || ct != "application/grpc" && !strings.HasPrefix(ct, "application/grpc+") && !strings.HasPrefix(ct, "application/grpc;") {
		st.finish(httpStatus(http.StatusUnsupportedMediaType))
		return
	}
	if h.path != adsPath {
		st.finish(trailers(true, codeUnimplemented, "unknown method "+h.path+": this server serves "+adsPath))
		return
	}
	if enc := h.encoding; enc != "" && enc != "identity" {
		st.finish(trailers(true, codeUnimplemented, "compression "+enc+" is not supported"))
		return
	}
	var user string
	var r *http.Request
	if s.authorize != nil {
		// Who the client is, before anything is sent: a stream without
		// a valid token ends at once (a review that failed ends it
		// UNAVAILABLE, and the client tries again).
		ctx, cancel := context.WithCancel(context.Background())
		st.cancel = cancel
		r, _ = http.NewRequestWithContext(ctx, http.MethodPost, "http://xds"+adsPath, nil)
		r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/2.0", 2, 0
		r.RemoteAddr = c.remote
		if h.auth != "" {
			r.Header.Set("Authorization", h.auth)
		}
		u, code, msg := s.authorize(r, "")
		if code != 0 {
			s.refusedLog.Do(func() {
				s.log.Warn("xDS client refused", "remote", c.remote, "status", code, "error", msg)
			})
			st.finish(trailers(true, codeOfHTTP(code), msg))
			return
		}
		user = u
	}
	caller := callerOf(c.remote, user)
	release, reason, msg := s.gate.admit(c.xc, caller)
	if reason != "" {
		s.refuse(reason, caller, msg)
		st.finish(trailers(true, codeResourceExhausted, msg))
		return
	}
	st.release = release
	c.mu.Lock()
	if st.reset {
		c.mu.Unlock()
		return // evGone follows
	}
	st.head = responseHead
	start := c.kickLocked()
	c.mu.Unlock()
	c.startWriter(start)
	st.cl = s.newClient(st, r, user, caller)
	if d := s.limits.FirstRequest; d > 0 {
		st.first = time.AfterFunc(d, func() { st.signal(evFirst) })
	}
}

// send queues a message (frame, its gRPC prefix left for here) of the
// short type kind; errGone when the stream is gone. A message not
// written within sendTimeout (the client does not read) resets the
// stream.
func (st *h2stream) send(kind string, frame []byte) error {
	frame[0] = 0
	binary.BigEndian.PutUint32(frame[1:frameHeader], uint32(len(frame)-frameHeader))
	c := st.c
	c.mu.Lock()
	if st.reset || c.dead {
		c.mu.Unlock()
		return errGone
	}
	if len(st.out) == 0 {
		if st.timer == nil {
			st.timer = time.AfterFunc(sendTimeout, st.expired)
		} else {
			st.timer.Reset(sendTimeout)
		}
	}
	st.out = append(st.out, outMsg{frame, kind})
	start := c.kickLocked()
	c.mu.Unlock()
	c.startWriter(start)
	return nil
}

// expired resets a stream whose messages waited sendTimeout.
func (st *h2stream) expired() {
	c := st.c
	c.mu.Lock()
	if len(st.out) == 0 || st.reset {
		c.mu.Unlock()
		return
	}
	st.dropOutputLocked()
	st.reset = true
	st.rst = errCancel
	start := st.signalLocked(evGone)
	startW := c.kickLocked()
	c.mu.Unlock()
	st.start(start)
	c.startWriter(startW)
}

// take reads a DATA frame's bytes p into messages (the reader's): the
// requests whole, each with the credit of its bytes in p, which they
// hold until handled; the credit of the rest, to give back now; whether
// a message is begun and not whole (and when one began in p); and the
// error that ends the stream.
func (st *h2stream) take(p []byte) (credit int32, reqs []queuedReq, partial, began bool, err error) {
	credit = int32(len(p))
	for len(p) > 0 {
		if len(st.msg) == 0 && len(p) >= frameHeader {
			// A whole message in p is read where it lies.
			if n, err := messageLength(p); err != nil {
				return credit, reqs, false, false, err
			} else if len(p) >= frameHeader+n {
				req, err := decodeRequest(p[frameHeader : frameHeader+n])
				if err != nil {
					return credit, reqs, false, false, &statusError{codeInvalid, err.Error()}
				}
				reqs = append(reqs, queuedReq{req, int32(frameHeader + n)})
				credit -= int32(frameHeader + n)
				p = p[frameHeader+n:]
				continue
			}
		}
		inP := 0
		if len(st.msg) < frameHeader {
			began = began || len(st.msg) == 0
			k := min(frameHeader-len(st.msg), len(p))
			st.msg = append(st.msg, p[:k]...)
			p, inP = p[k:], k
			if len(st.msg) < frameHeader {
				return credit, reqs, true, began, nil
			}
			n, err := messageLength(st.msg)
			if err != nil {
				return credit, reqs, false, false, err
			}
			st.need = n
		}
		// Read as it comes, not allocated as announced: a length alone
		// reserves nothing.
		k := min(frameHeader+st.need-len(st.msg), len(p))
		st.msg = append(st.msg, p[:k]...)
		p, inP = p[k:], inP+k
		if len(st.msg) < frameHeader+st.need {
			return credit, reqs, true, began, nil
		}
		req, err := decodeRequest(st.msg[frameHeader:])
		st.msg, st.need = nil, 0
		if err != nil {
			return credit, reqs, false, false, &statusError{codeInvalid, err.Error()}
		}
		reqs = append(reqs, queuedReq{req, int32(inP)})
		credit -= int32(inP)
	}
	return credit, reqs, false, began, nil
}

// messageLength reads a gRPC message's prefix.
func messageLength(p []byte) (int, error) {
	switch p[0] {
	case 0:
	case 1:
		return 0, &statusError{codeUnimplemented, "compressed messages are not supported"}
	default:
		return 0, &statusError{codeInvalid, "not a gRPC message"}
	}
	n := binary.BigEndian.Uint32(p[1:frameHeader])
	if n > maxMessage {
		return 0, &statusError{codeInvalid, fmt.Sprintf("a request of %d bytes, over %d", n, maxMessage)}
	}
	return int(n), nil
}

// msgTimeoutLocked starts (or stops) the bound on a message begun: it
// is to be whole within messageTimeout, or the stream ends (under c.mu).
func (st *h2stream) msgTimeoutLocked(partial, began bool) {
	if !partial {
		if st.msgTimer != nil {
			st.msgTimer.Stop()
			st.msgTimer = nil
		}
		return
	}
	if st.msgTimer != nil && !began {
		return
	}
	if st.msgTimer != nil {
		st.msgTimer.Stop()
	}
	within := time.Duration(messageTimeout.Load())
	n := st.need
	st.msgTimer = time.AfterFunc(within, func() {
		c := st.c
		c.mu.Lock()
		start := false
		if st.recvErr == nil && !st.gone() {
			st.recvErr = &statusError{codeInvalid, fmt.Sprintf("a message of %d bytes not received within %s", n, within)}
			if n == 0 {
				st.recvErr = &statusError{codeInvalid, "a gRPC message's prefix not received within " + within.String()}
			}
			start = st.signalLocked(evFail)
		}
		c.mu.Unlock()
		st.start(start)
	})
}
