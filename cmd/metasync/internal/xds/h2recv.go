package xds

import (
	"encoding/binary"
	"time"
)

// The frames of the server's HTTP/2 that concern a stream, read as RFC
// 9113 §5.1 says of each state: a frame on an idle stream (one the
// client has not opened yet) other than HEADERS and PRIORITY ends the
// connection (PROTOCOL_ERROR); one on a closed stream is answered
// STREAM_CLOSED, unless the server reset that stream itself (then it is
// ignored).

// idleStream reports whether id is a stream the client has not opened:
// above the last it opened, or one of the server's (even ids), which
// the server never opens.
func (c *h2conn) idleStream(id uint32) bool {
	return id%2 == 0 || id > c.lastID.Load()
}

// hpackRelease is an indexed field of the static table (":method: GET"):
// decoding it changes no state.
var hpackRelease = []byte{0x82}

// open decodes a whole header block and opens its stream (why: a reason
// the HEADERS frame made the request malformed, "" when none); a block
// on a stream opened before is its trailers.
func (c *h2conn) open(id uint32, end bool, block []byte, why string) error {
	if id%2 == 0 {
		return connError{errProtocol, "HEADERS on a stream id of the server's"}
	}
	later := id <= c.lastID.Load()
	c.fields = headerFields{contentLength: -1, trailer: later}
	c.dec.SetEmitEnabled(true)
	if _, err := c.dec.Write(block); err != nil {
		return connError{errCompression, "a header block that does not decode: " + err.Error()}
	}
	if err := c.dec.Close(); err != nil {
		return connError{errCompression, "a header block cut short"}
	}
	// The decoder keeps the last bytes written to it: a field of the
	// static table, decoded with emit off, leaves it holding that byte,
	// not the block (nor the pooled frame that it lies in) for the
	// connection's life.
	c.dec.SetEmitEnabled(false)
	_, _ = c.dec.Write(hpackRelease)
	_ = c.dec.Close()
	h := c.fields
	c.fields = headerFields{}
	if why == "" {
		why = h.check()
	}
	if later {
		return c.trailers(id, end, &h, why)
	}
	c.lastID.Store(id)
	if h.bad {
		return c.control(rstFrame(id, errRefusedStream))
	}
	if why != "" {
		c.malformed(why)
		return c.control(rstFrame(id, errProtocol))
	}
	c.mu.Lock()
	if c.dead || c.closing || c.openLocked() >= h2MaxStreams || len(c.streams) >= 4*h2MaxStreams {
		c.mu.Unlock()
		return c.control(rstFrame(id, errRefusedStream))
	}
	st := &h2stream{c: c, id: id, sendWindow: int64(c.peerWindow), recvWindow: h2Window, req: &h, ev: evOpen,
		contentLength: h.contentLength}
	if end {
		st.ev |= evEOF
		st.remoteDone = true
		if h.contentLength > 0 {
			st.ev, st.req = 0, nil
			c.streams = append(c.streams, st)
			c.resetUnlock(st, errProtocol)
			c.malformed("a content-length of a request without a body")
			return nil
		}
	}
	c.streams = append(c.streams, st)
	if c.idle != nil {
		c.idle.Stop()
	}
	start := st.signalLocked(0)
	c.mu.Unlock()
	st.start(start)
	return nil
}

// resetUnlock resets st with a RST_STREAM of code (under c.mu, which it
// unlocks), and starts what is to run then: the stream's goroutine, a
// writer.
func (c *h2conn) resetUnlock(st *h2stream, code uint32) {
	start := st.resetLocked(code)
	startW := c.kickLocked()
	c.mu.Unlock()
	st.start(start)
	c.startWriter(startW)
}

// malformed tells of a malformed request (a few lines a minute).
func (c *h2conn) malformed(why string) {
	c.t.connLog.Do(func() {
		c.t.log.Warn("xDS request malformed: its stream is reset (a few such lines a minute at most)", "remote", c.remote, "error", why)
	})
}

// trailers takes a header block on a stream opened before: the
// request's trailers, which end it (the client's side), else a stream
// or connection error as the stream's state says.
func (c *h2conn) trailers(id uint32, end bool, h *headerFields, why string) error {
	c.mu.Lock()
	st := c.streamLocked(id)
	switch {
	case st != nil && st.rstSent:
		c.mu.Unlock()
		return nil // reset by the server: what comes after is ignored
	case st == nil:
		// Closed and let go, or never opened (a lower id than one
		// opened): an unexpected stream id (§5.1.1).
		c.mu.Unlock()
		return connError{errProtocol, "HEADERS on a stream closed, or of an id below one opened"}
	case st.reset:
		c.mu.Unlock()
		return connError{errStreamClosed, "HEADERS on a stream the client reset"}
	case st.remoteDone && st.ended:
		// Closed both ways, though not let go yet (§5.1).
		c.mu.Unlock()
		return connError{errStreamClosed, "HEADERS on a closed stream"}
	}
	code := uint32(0)
	switch {
	case st.remoteDone:
		code = errStreamClosed // half-closed (remote)
	case h.bad || why != "" || !end:
		code = errProtocol // trailers end the stream, with no pseudo-header
	case st.contentLength >= 0 && st.bodyLen != st.contentLength:
		code, why = errProtocol, "a body whose length is not its content-length"
	}
	var start bool
	if code != 0 {
		start = st.resetLocked(code)
	} else {
		st.remoteDone = true
		if !st.finished {
			start = st.signalLocked(evEOF)
		}
	}
	startW := c.kickLocked()
	c.mu.Unlock()
	if why != "" {
		c.malformed(why)
	}
	st.start(start)
	c.startWriter(startW)
	return nil
}

// data takes a DATA frame's bytes into its stream's messages.
func (c *h2conn) data(flags byte, id uint32, p []byte) error {
	if id == 0 {
		return connError{errProtocol, "DATA without a stream"}
	}
	if c.idleStream(id) {
		return connError{errProtocol, "DATA on a stream never opened"}
	}
	n := int32(len(p))
	if n > c.recvWindow {
		return connError{errFlowControl, "DATA beyond the connection's window"}
	}
	c.recvWindow -= n
	// The connection's credit goes back at once: a stream's own window
	// holds back a client that sends faster than its requests are
	// handled.
	c.owed += n
	p, pad, err := unpad(flags, p)
	if err != nil {
		return err
	}
	var ctrl []byte
	if c.owed >= h2Window/4 {
		ctrl = windowFrame(ctrl, 0, uint32(c.owed))
		c.recvWindow += c.owed
		c.owed = 0
	}
	c.mu.Lock()
	st := c.streamLocked(id)
	if st != nil && st.contentLength >= 0 && !st.gone() && !st.remoteDone {
		st.bodyLen += int64(len(p))
		if st.bodyLen > st.contentLength || flags&flagEndStream != 0 && st.bodyLen != st.contentLength {
			c.resetUnlock(st, errProtocol)
			c.malformed("a body whose length is not its content-length")
			if ctrl != nil {
				return c.control(ctrl)
			}
			return nil
		}
	}
	if st == nil || st.remoteDone || st.gone() || st.recvErr != nil {
		var start bool
		answer := false
		switch {
		case st == nil:
			answer = true // closed and let go
		case st.rstSent:
			// Reset by the server: ignored.
		case st.remoteDone && !st.gone():
			// DATA after the client ended its side: the stream is reset.
			start = st.resetLocked(errStreamClosed)
		case st.remoteDone, st.reset:
			answer = true // closed both ways, or reset by the client
		default:
			// Its response ended (or its request could not be read)
			// while the client still sends: ignored.
		}
		c.mu.Unlock()
		st.start(start)
		if ctrl != nil {
			if err := c.control(ctrl); err != nil {
				return err
			}
		}
		if answer {
			return c.control(rstFrame(id, errStreamClosed))
		}
		c.mu.Lock()
		startW := c.kickLocked()
		c.mu.Unlock()
		c.startWriter(startW)
		return nil
	}
	if n > st.recvWindow {
		c.mu.Unlock()
		return connError{errFlowControl, "DATA beyond the stream's window"}
	}
	st.recvWindow -= n
	credit := pad + st.takeLocked(p)
	if credit > 0 && flags&flagEndStream == 0 {
		ctrl = windowFrame(ctrl, id, uint32(credit))
		st.recvWindow += credit
	}
	if ctrl != nil {
		if len(c.ctrl)+len(ctrl) > h2MaxControl {
			c.mu.Unlock()
			return connError{errEnhanceCalm, "control frames asked for faster than they are read"}
		}
		c.ctrl = append(c.ctrl, ctrl...)
	}
	ev := 0
	if st.recvErr != nil {
		ev |= evFail
	}
	if flags&flagEndStream != 0 {
		st.remoteDone = true
		ev |= evEOF
	}
	start := st.signalLocked(ev)
	startW := c.kickLocked()
	c.mu.Unlock()
	st.start(start)
	c.startWriter(startW)
	return nil
}

// priority takes a PRIORITY frame: the server does not prioritize, but
// checks it (§6.3): of 5 bytes, on a stream, not on itself.
func (c *h2conn) priority(id uint32, p []byte) error {
	if id == 0 {
		return connError{errProtocol, "PRIORITY without a stream"}
	}
	if len(p) != 5 {
		return c.control(rstFrame(id, errFrameSize))
	}
	if binary.BigEndian.Uint32(p)&0x7fffffff == id {
		c.mu.Lock()
		if st := c.streamLocked(id); st != nil && !st.reset {
			c.resetUnlock(st, errProtocol)
			return nil
		}
		c.mu.Unlock()
		return c.control(rstFrame(id, errProtocol))
	}
	return nil
}

// windowUpdate takes a WINDOW_UPDATE of inc on stream id (0: the
// connection): an increment of 0, or a window over 2^31-1, is an error
// of the stream, or of the connection (§6.9, §6.9.1).
func (c *h2conn) windowUpdate(id uint32, inc int64) error {
	if id != 0 && c.idleStream(id) {
		return connError{errProtocol, "WINDOW_UPDATE on an idle stream"}
	}
	if id == 0 && inc == 0 {
		return connError{errProtocol, "a WINDOW_UPDATE of 0"}
	}
	c.mu.Lock()
	if id == 0 {
		c.sendWindow += inc
		if c.sendWindow > 1<<31-1 {
			c.mu.Unlock()
			return connError{errFlowControl, "the connection's window over 2^31-1"}
		}
	} else if st := c.streamLocked(id); (st == nil || st.reset) && inc == 0 {
		// An increment of 0 is a stream error whatever the stream's
		// state (§6.9).
		c.mu.Unlock()
		return c.control(rstFrame(id, errProtocol))
	} else if st != nil && !st.reset {
		code := uint32(0)
		st.sendWindow += inc
		switch {
		case inc == 0:
			code = errProtocol
		case st.sendWindow > 1<<31-1:
			code = errFlowControl
		}
		if code != 0 {
			c.resetUnlock(st, code)
			return nil
		}
	}
	start := c.kickLocked()
	c.mu.Unlock()
	c.startWriter(start)
	return nil
}

// ping answers a PING (§6.7): of 8 bytes, on the connection.
func (c *h2conn) ping(flags byte, id uint32, p []byte) error {
	if id != 0 {
		return connError{errProtocol, "PING on a stream"}
	}
	if len(p) != 8 {
		return connError{errFrameSize, "a PING frame not of 8 bytes"}
	}
	if flags&flagAck != 0 {
		c.pong(p)
		return nil
	}
	if err := c.pingBudget(time.Now()); err != nil {
		return err
	}
	return c.control(append(appendFrameHeader(nil, 8, framePing, flagAck, 0), p...))
}
