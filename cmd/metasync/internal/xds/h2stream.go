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

// The transport's events of a stream, which its goroutine handles one at
// a time, before the protocol's wakes (Stream.Wake).
const (
	evOpen     = 1 << iota // its headers came
	evPlain                // a request not gRPC's is answered now (h2FrameTimeout)
	evEOF                  // the client ended its side
	evFail                 // a request that cannot be read (recvErr)
	evGone                 // reset, or its connection ended
	evShutdown             // the server shuts down: the stream ends UNAVAILABLE
)

// h2stream is one ADS stream, the protocol's Stream. No goroutine is
// its own at rest: run handles its events, one at a time, in a
// goroutine started when one comes and ended when none is left; and
// while a response it sent waits to be written, it handles none but its
// end (its requests wait, and hold their flow-control credit: a client
// that does not read cannot make it queue more). Its Handler is called
// from run alone.
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
	// ctx is the stream's Context, made when asked for; cancel ends it.
	ctx     context.Context
	cancel  context.CancelFunc
	ev      int
	wake    Wakeup // the protocol's, asked for with Wake
	running bool
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

	// run's own: the protocol's side of the stream; the answer due to
	// a request not gRPC's.
	h       Handler
	plainAt *time.Timer
	cleaned bool
}

// outMsg is a message to write, and the hook its sender gave (see
// Stream.Send).
type outMsg struct {
	b       []byte
	written func()
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
	return st.ev != 0 || st.wake != 0 || st.ready > 0
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

// Wake asks for a turn of the stream's Handler (Stream).
func (st *h2stream) Wake(w Wakeup) {
	st.c.mu.Lock()
	st.wake |= w
	start := st.signalLocked(0)
	st.c.mu.Unlock()
	st.start(start)
}

// Context is done once the stream is gone (Stream); it is made when
// first asked for.
func (st *h2stream) Context() context.Context {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.ctx == nil {
		st.ctx, st.cancel = context.WithCancel(context.Background())
		if st.reset {
			st.cancel() // reset already: what waits on it ends at once
		}
	}
	return st.ctx
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
		job, w, msg := st.nextLocked()
		startW := false
		if msg != nil {
			// The request is taken: the client may send as much again.
			if credit := st.creditLocked(int32(frameHeader + len(msg))); credit > 0 {
				c.ctrl = windowFrame(c.ctrl, st.id, uint32(credit))
				st.recvWindow += credit
				startW = c.kickLocked()
			}
		}
		if job == 0 && w == 0 && msg == nil {
			st.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.startWriter(startW)
		st.handle(job, w, msg)
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
// the transport's other events, and then the protocol's wakes (w), the
// lowest first.
func (st *h2stream) nextLocked() (job int, w Wakeup, msg []byte) {
	if st.ev&evGone != 0 {
		st.ev &^= evGone
		return evGone, 0, nil
	}
	if st.finished || !st.idleLocked() {
		return 0, 0, nil
	}
	if st.ev&evOpen != 0 {
		st.ev &^= evOpen
		return evOpen, 0, nil
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
		return 0, 0, msg
	}
	for _, ev := range [...]int{evShutdown, evFail, evEOF, evPlain} {
		if st.ev&ev != 0 {
			st.ev &^= ev
			return ev, 0, nil
		}
	}
	w = st.wake & -st.wake
	st.wake &^= w
	return 0, w, nil
}

// handle handles one event: the transport's, a request (msg) or a wake
// (w) for the protocol.
func (st *h2stream) handle(job int, w Wakeup, msg []byte) {
	c := st.c
	switch job {
	case evGone:
		st.cleanup()
		c.mu.Lock()
		st.finished = true
		st.inbox, st.ready = nil, 0
		if st.idleLocked() {
			c.removeLocked(st)
		}
		c.mu.Unlock()
		return
	case evOpen:
		st.open()
		return
	}
	if st.h == nil {
		if st.plain && (job == evEOF || job == evPlain || job == evShutdown) {
			st.finishPlain(http.StatusUnsupportedMediaType, notGRPC)
		}
		return
	}
	var err error
	switch {
	case msg != nil:
		err = st.h.Request(msg)
	case w != 0:
		err = st.h.Wake(w)
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
			st.timer = time.AfterFunc(time.Duration(sendTimeout.Load()), st.expired)
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
	if st.plainAt != nil {
		st.plainAt.Stop()
	}
	if st.h != nil {
		st.h.Close()
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

// open answers the stream's headers: a request not gRPC's is answered
// once whole; else the protocol admits the stream (its response begins)
// or refuses it (a response of trailers alone ends it at once).
func (st *h2stream) open() {
	c := st.c
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
			st.plainAt = time.AfterFunc(h2FrameTimeout, func() { st.signal(evPlain) })
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
	handler, err := c.t.ads.open(st, Peer{Addr: c.remote, Authorization: h.auth, Conn: c.raw})
	if err != nil {
		var se *statusError
		if !errors.As(err, &se) {
			se = &statusError{codeInternal, err.Error()}
		}
		st.finish(trailers(true, se.code, se.message))
		return
	}
	st.h = handler
	c.mu.Lock()
	if st.reset {
		c.mu.Unlock()
		return // evGone follows, and closes the handler
	}
	st.head = responseHead
	start := c.kickLocked()
	c.mu.Unlock()
	c.startWriter(start)
}

// Send queues a message (frame, its gRPC prefix left for here), and
// written to call once it is written (Stream); errGone when the stream
// is gone. A message not written within sendTimeout (the client does
// not read) resets the stream.
func (st *h2stream) Send(frame []byte, written func()) error {
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
			st.timer = time.AfterFunc(time.Duration(sendTimeout.Load()), st.expired)
		} else {
			st.timer.Reset(time.Duration(sendTimeout.Load()))
		}
	}
	st.out = append(st.out, outMsg{frame, written})
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
