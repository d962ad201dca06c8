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
	evOpen     = 1 << iota // its headers came
	evChanged              // assignments it follows changed (client.pending)
	evAgain                // access not told before: ask again
	evRecheck              // the Authorizer is to be asked again
	evReload               // a reload: targets may have come or gone
	evFirst                // no request within Limits.FirstRequest
	evEOF                  // the client ended its side
	evFail                 // a request that cannot be read (recvErr)
	evGone                 // reset, or its connection ended
	evShutdown             // the server shuts down: the stream ends UNAVAILABLE
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
	// inbox holds the request messages read and not handled yet (gRPC
	// prefix included): ready bytes of whole messages, then the one
	// being read. early is the flow-control credit given back for bytes
	// of inbox before they were handled: only while no whole message
	// waits, so that a message larger than the window can come whole,
	// and a client may send one more request while a response waits on
	// it. Else what inbox holds holds its credit: a stream holds at most
	// one whole message (at most maxMessage) and its window.
	inbox    []byte
	ready    int
	early    int32
	partAt   int64 // where the message being read began, counted in all bytes read
	consumed int64 // bytes of inbox handled, ever
	recvErr  error
	msgTimer *time.Timer // a message begun, to be whole within messageTimeout
	cancel   context.CancelFunc
	ev       int
	running  bool
	// remoteDone: the client ended its side; reset: reset, or its
	// connection ended: nothing more is read or written; finished:
	// ended, its state let go, what is queued is written.
	remoteDone, reset, finished bool
	// rstSent: the server reset the stream (a RST_STREAM written or to
	// write): frames that come after on it are ignored. endData: the
	// response ends with its last DATA frame (a plain HTTP response),
	// not with trailers.
	rstSent, endData bool
	// ended: the frame that ends the server's side (END_STREAM) is
	// written, or being written.
	ended bool
	// plain: a request that is not gRPC's: its body is dropped, and it
	// is answered once whole (or after h2FrameTimeout); head0: it is a
	// HEAD request, answered without a body.
	plain, head0 bool
	// contentLength is the request's content-length (-1: none), bodyLen
	// the DATA read, when it has one.
	contentLength, bodyLen int64

	// run's own.
	cl         *client
	release    func()
	first      *time.Timer
	gotRequest bool
	cleaned    bool
}

// outMsg is a gRPC message to write, of the short type kind.
type outMsg struct {
	b    []byte
	kind string
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
	return st.ev != 0 || st.ready > 0
}

// resetLocked resets the stream (with a RST_STREAM of code, 0 for none):
// what waits to be written is dropped, a review under way is cancelled,
// and its goroutine lets its state go. It reports whether run is to
// start.
func (st *h2stream) resetLocked(code uint32) bool {
	st.dropOutputLocked()
	st.reset = true
	st.rst = code
	st.rstSent = st.rstSent || code != 0
	if st.cancel != nil {
		st.cancel()
	}
	return st.signalLocked(evGone)
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
		job, msg := st.nextLocked()
		startW := false
		if msg != nil {
			// The request is taken: the client may send as much again.
			if credit := st.creditLocked(int32(frameHeader + len(msg))); credit > 0 {
				c.ctrl = windowFrame(c.ctrl, st.id, uint32(credit))
				st.recvWindow += credit
				startW = c.kickLocked()
			}
		}
		if job == 0 && msg == nil {
			st.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.startWriter(startW)
		st.handle(job, msg)
	}
}

// creditLocked is the credit to give back once m bytes of inbox were
// handled (those not given back early), and that of the message being
// read when nothing else waits.
func (st *h2stream) creditLocked(m int32) int32 {
	if st.remoteDone || st.gone() {
		return 0
	}
	paid := min(m, st.early)
	st.early -= paid
	return m - paid + st.payPartialLocked()
}

// payPartialLocked gives back early the credit of the message being
// read, when no whole message waits.
func (st *h2stream) payPartialLocked() int32 {
	if st.ready > 0 || st.remoteDone || st.gone() {
		return 0
	}
	unpaid := int32(len(st.inbox)) - st.early
	if unpaid <= 0 {
		return 0
	}
	st.early += unpaid
	return unpaid
}

// nextLocked takes the next event to handle: the end first; else, when
// nothing waits to be written, the opening, the requests in order (msg),
// and then the rest.
func (st *h2stream) nextLocked() (job int, msg []byte) {
	if st.ev&evGone != 0 {
		st.ev &^= evGone
		return evGone, nil
	}
	if st.finished || !st.idleLocked() {
		return 0, nil
	}
	if st.ev&evOpen != 0 {
		st.ev &^= evOpen
		return evOpen, nil
	}
	if st.ready > 0 {
		// Handled out of the lock: nothing writes this part of inbox
		// again (the reader appends after it).
		m := frameHeader + int(binary.BigEndian.Uint32(st.inbox[1:frameHeader]))
		msg = st.inbox[frameHeader:m:m]
		st.inbox, st.ready, st.consumed = st.inbox[m:], st.ready-m, st.consumed+int64(m)
		if len(st.inbox) == 0 {
			st.inbox = nil
		}
		st.msgTimeoutLocked() // the message being read gets its credit: its time runs
		return 0, msg
	}
	for _, ev := range [...]int{evShutdown, evFail, evEOF, evFirst, evChanged, evAgain, evRecheck, evReload} {
		if st.ev&ev != 0 {
			st.ev &^= ev
			return ev, nil
		}
	}
	return 0, nil
}

// handle handles one event.
func (st *h2stream) handle(job int, msg []byte) {
	c := st.c
	if job == evGone {
		st.cleanup()
		c.mu.Lock()
		st.finished = true
		st.inbox, st.ready = nil, 0
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
		if st.plain && (job == evEOF || job == evFirst || job == evShutdown) {
			st.finishPlain(http.StatusUnsupportedMediaType, notGRPC)
		}
		return
	}
	s := cl.s
	var err error
	switch {
	case msg != nil:
		if st.first != nil {
			st.first.Stop()
			st.first = nil
		}
		st.gotRequest = true
		var req request
		if req, err = decodeRequest(msg); err != nil {
			err = &statusError{codeInvalid, err.Error()}
		} else {
			err = cl.request(req)
		}
	case job == evShutdown:
		err = &statusError{codeUnavailable, "the xDS server is shutting down: connect again"}
	case job == evFail:
		c.mu.Lock()
		err = st.recvErr
		c.mu.Unlock()
	case job == evEOF:
		err = io.EOF
		c.mu.Lock()
		if len(st.inbox) > 0 {
			err = &statusError{codeInvalid, "a gRPC message cut short"}
		}
		c.mu.Unlock()
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
	st.inbox, st.ready = nil, 0
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

// notGRPC is the body of the answer to a request that is not gRPC.
const notGRPC = "this port serves gRPC only (xDS: " + adsPath + ")\n"

// finishPlain ends the stream with a plain HTTP response of status code
// and a text body (a request that is not gRPC's), written within
// sendTimeout.
func (st *h2stream) finishPlain(code int, body string) {
	if st.finished {
		return
	}
	st.cleanup()
	c := st.c
	c.mu.Lock()
	st.finished = true
	st.inbox, st.ready = nil, 0
	switch {
	case st.reset:
	case st.head0:
		// A HEAD request: the response's headers alone end it.
		st.tail = plainHead(code)
	default:
		st.head = plainHead(code)
		st.out = []outMsg{{b: []byte(body)}}
		st.endData = true
		if st.timer == nil {
			st.timer = time.AfterFunc(sendTimeout, st.expired)
		}
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
	// The send timer stays: what the stream sent before it ended is
	// still to be written within sendTimeout.
	c := st.c
	c.mu.Lock()
	if st.cancel != nil {
		st.cancel()
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
		// Answered once the request is whole, as an HTTP server that
		// reads the body does.
		c.mu.Lock()
		st.plain, st.head0 = true, h.method == http.MethodHead
		st.inbox, st.ready, st.recvErr = nil, 0, nil
		whole := st.remoteDone
		c.mu.Unlock()
		if whole {
			st.finishPlain(http.StatusUnsupportedMediaType, notGRPC)
		} else {
			st.first = time.AfterFunc(h2FrameTimeout, func() { st.signal(evFirst) })
		}
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
		c.mu.Lock()
		st.cancel = cancel
		if st.reset {
			cancel() // reset already: the review ends at once
		}
		c.mu.Unlock()
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
	if start {
		// Written here, not by a writer of its own: the stream's
		// goroutine has nothing else to do until its message is out.
		// Once it is, what the connection's other streams have to write
		// goes to a writer of its own.
		c.write(st)
	}
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
	start := st.resetLocked(errCancel)
	startW := c.kickLocked()
	c.mu.Unlock()
	st.start(start)
	c.startWriter(startW)
}

// takeLocked takes a DATA frame's bytes into inbox and returns the
// credit to give back now (under c.mu): all of it while no whole message
// waits, else none. A message begun starts its timer; one whose prefix
// is not gRPC's, or too long, sets recvErr.
func (st *h2stream) takeLocked(p []byte) int32 {
	if st.plain {
		return int32(len(p)) // a body that is not gRPC's: dropped
	}
	backed := st.ready > 0
	// Read as it comes, not allocated as announced: a length alone
	// reserves nothing.
	st.inbox = append(st.inbox, p...)
	var credit int32
	if !backed {
		credit = int32(len(p))
		st.early += credit
	}
	for {
		rest := st.inbox[st.ready:]
		if len(rest) < frameHeader {
			break
		}
		n, err := messageLength(rest)
		if err != nil {
			st.recvErr = err
			st.inbox = st.inbox[:st.ready]
			break
		}
		if len(rest) < frameHeader+n {
			break
		}
		st.ready += frameHeader + n
	}
	st.msgTimeoutLocked()
	return credit
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

// msgTimeoutLocked starts the bound on the message being read, when one
// began, or stops it: it is to be whole within messageTimeout, or the
// stream ends (under c.mu). It does not run while a whole message waits:
// the message being read then waits on credit that the server holds
// back, and it gets messageTimeout anew once the credit comes.
func (st *h2stream) msgTimeoutLocked() {
	if len(st.inbox) == st.ready || st.recvErr != nil || st.ready > 0 {
		if st.msgTimer != nil {
			st.msgTimer.Stop()
			st.msgTimer = nil
		}
		return
	}
	at := st.consumed + int64(st.ready)
	if st.msgTimer != nil && at == st.partAt {
		return // the same message
	}
	if st.msgTimer != nil {
		st.msgTimer.Stop()
	}
	st.partAt = at
	within := time.Duration(messageTimeout.Load())
	n := -1
	if rest := st.inbox[st.ready:]; len(rest) >= frameHeader {
		n = int(binary.BigEndian.Uint32(rest[1:frameHeader]))
	}
	st.msgTimer = time.AfterFunc(within, func() {
		c := st.c
		c.mu.Lock()
		start := false
		if st.recvErr == nil && !st.gone() && st.partAt == at && len(st.inbox) > st.ready {
			st.recvErr = &statusError{codeInvalid, fmt.Sprintf("a message of %d bytes not received within %s", n, within)}
			if n < 0 {
				st.recvErr = &statusError{codeInvalid, "a gRPC message's prefix not received within " + within.String()}
			}
			start = st.signalLocked(evFail)
		}
		c.mu.Unlock()
		st.start(start)
	})
}
