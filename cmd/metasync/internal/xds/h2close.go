package xds

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"
)

// How a connection of the server's HTTP/2 ends, and what keeps it
// honest while it lives:
//
//   - A connection the server ends gets a GOAWAY that reaches the
//     client: the GOAWAY is written, the writing side closed (the client
//     reads the GOAWAY, then the end of the stream), and what the client
//     still sends is read and dropped for up to h2DrainTimeout before the
//     socket is closed. Closing a socket with bytes unread makes the
//     kernel send a reset, and a client that gets it loses what it had
//     not read yet: the GOAWAY.
//   - On shutdown (Transport.Shutdown) every connection gets
//     GOAWAY(NO_ERROR), its open ADS streams end with UNAVAILABLE, and it
//     closes as above once they are written.
//   - A connection quiet for h2KeepaliveTime gets a PING; one that does
//     not acknowledge it within h2KeepaliveTimeout is a dead peer, closed.
//   - A client's PINGs and SETTINGS spend a budget (pingBudget); header
//     blocks begun and not ended are bounded across every connection
//     (h2MaxBlockBytes).

// Variables for the tests.
var (
	// h2DrainTimeout bounds the reading and dropping of what a client
	// sends after the server's GOAWAY.
	h2DrainTimeout = time.Second
	// h2KeepaliveTime is how long a connection may be quiet (no frame
	// read) before the server PINGs it; h2KeepaliveTimeout how long the
	// PING's acknowledgement may take before the peer is taken for dead
	// and its connection closed. The transport looks every
	// h2KeepaliveTime/6: a dead peer is dropped within
	// h2KeepaliveTime + h2KeepaliveTimeout + 2 × h2KeepaliveTime/6
	// (55 s with the defaults).
	h2KeepaliveTime    = 30 * time.Second
	h2KeepaliveTimeout = 15 * time.Second
	// h2MaxBlockBytes bounds the header blocks begun and not ended, of
	// every connection together: a connection that would pass it is cut.
	h2MaxBlockBytes int64 = 64 << 20
)

const (
	// h2PingBurst and h2PingRate make the budget of a client's PINGs
	// and SETTINGS: h2PingBurst at once, h2PingRate more each second,
	// and one more for each DATA frame of 1 KiB or more the server
	// wrote, or that ended an xDS response (gRPC's bandwidth estimation
	// PINGs once per round trip while DATA comes, at most once per
	// frame it reads; a frame's size is the client's window's to
	// decide, and frames of a byte earn nothing).
	// A client past it is cut (ENHANCE_YOUR_CALM), whether it reads
	// the acknowledgements or not.
	h2PingBurst = 100
	h2PingRate  = 10
)

// keepalivePing is the payload of the server's keepalive PINGs.
var keepalivePing = [8]byte{'m', 'e', 't', 'a', 's', 'y', 'n', 'c'}

// end ends the connection once its reader ended for err: its streams go,
// and, after a GOAWAY, what the client still sends is drained before the
// socket is closed.
func (c *h2conn) end(err error) {
	c.teardown()
	var ce connError
	isConnErr := errors.As(err, &ce)
	if !isConnErr && c.started && !c.goneAway.Load() {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			// A frame or header block not whole in time.
			c.goAway(errEnhanceCalm, c.lastID.Load())
		}
	}
	if c.goneAway.Load() && !errors.Is(err, io.EOF) && !c.draining.Load() {
		c.drain()
	}
	c.t.closeConn(c.raw)
	c.t.unregister(c)
	if isConnErr && ce.code != errNo {
		c.t.connLog.Do(func() {
			c.t.log.Warn("xDS connection trouble (a few such lines a minute at most)", "remote", c.remote, "error", err.Error())
		})
	}
}

// fail sends a GOAWAY for e and returns e: the reader ends, and the
// connection with it.
func (c *h2conn) fail(e connError) error {
	c.goAway(e.code, c.lastID.Load())
	return e
}

// goAway writes a GOAWAY of code, the last stream handled last (once: a
// second call writes nothing). A write under way is given a second to
// finish (its deadline is cut to that).
func (c *h2conn) goAway(code, last uint32) {
	if c.goneAway.Swap(true) {
		return
	}
	c.goingAway.Store(true)
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.broken || c.shut {
		return // a write failed, perhaps inside a frame
	}
	f := appendFrameHeader(nil, 8, frameGoAway, 0, 0)
	f = binary.BigEndian.AppendUint32(f, last)
	f = binary.BigEndian.AppendUint32(f, code)
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.nc.Write(f); err != nil {
		c.broken = true
	}
}

// shutWrite closes the writing side: the client reads what was written,
// then the end of the stream; what is left to write is dropped.
func (c *h2conn) shutWrite() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.shut {
		return
	}
	c.shut = true
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	nc := c.nc
	if xc, ok := nc.(*xconn); ok {
		nc = xc.Conn
	}
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// drain closes the writing side, then reads and drops what the client
// sends until it closes, for h2DrainTimeout and 1 MiB at most.
func (c *h2conn) drain() {
	c.shutWrite()
	_ = c.nc.SetReadDeadline(time.Now().Add(h2DrainTimeout))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.nc, 1<<20))
}

// goAwayAndDrain writes a GOAWAY of code and closes the writing side;
// the reader, which goes on reading (a stream that comes is refused),
// ends within h2DrainTimeout.
func (c *h2conn) goAwayAndDrain(code uint32) {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.goAway(code, c.lastID.Load())
	c.shutWrite()
	at := time.Now().Add(h2DrainTimeout)
	c.drainAt.Store(at.UnixNano())
	c.draining.Store(true)
	_ = c.nc.SetReadDeadline(at)
}

// setRestDeadline sets the read deadline between frames (the reader's
// own). A drain that begins meanwhile may have set its own deadline
// just before: it is looked at again once set, so that the drain's
// deadline is never lost.
func (c *h2conn) setRestDeadline() {
	_ = c.nc.SetReadDeadline(c.restDeadline())
	if c.draining.Load() {
		_ = c.nc.SetReadDeadline(c.restDeadline())
	}
}

// restDeadline is the read deadline between frames (the reader's own):
// that of a header block begun, or of the drain, whichever is first;
// zero for none.
func (c *h2conn) restDeadline() time.Time {
	d := c.blockDeadline
	if c.draining.Load() {
		if at := time.Unix(0, c.drainAt.Load()); d.IsZero() || at.Before(d) {
			d = at
		}
	}
	return d
}

// teardown lets the connection's streams go once its reader ended (each
// ends in its own goroutine).
func (c *h2conn) teardown() {
	c.mu.Lock()
	c.dead = true
	var starts []*h2stream
	for _, st := range c.streams {
		if st.resetLocked(0) {
			starts = append(starts, st)
		}
	}
	if c.idle != nil {
		c.idle.Stop()
	}
	c.mu.Unlock()
	c.holdBlock(0)
	c.block = nil
	for _, st := range starts {
		st.start(true)
	}
}

// idleLocked closes the connection after h2IdleTimeout without a stream
// (under c.mu, when it has none); a connection shutting down closes once
// it has none.
func (c *h2conn) idleLocked() {
	if c.dead {
		return
	}
	if c.shutting {
		go c.goAwayAndDrain(errNo)
		return
	}
	if c.idle == nil {
		c.idle = time.AfterFunc(h2IdleTimeout, func() {
			// Closing: a stream that comes now is refused (its client
			// may retry it elsewhere), not opened to be cut.
			c.mu.Lock()
			idle := len(c.streams) == 0 && !c.dead
			c.closing = c.closing || idle // in the same look: no stream opens after it
			c.mu.Unlock()
			if idle {
				c.goAwayAndDrain(errNo)
			}
		})
		return
	}
	c.idle.Reset(h2IdleTimeout)
}

// shutdown starts the connection's graceful end: GOAWAY(NO_ERROR), no
// new stream, every open stream ended with UNAVAILABLE; the connection
// closes once they are written.
func (c *h2conn) shutdown() {
	c.mu.Lock()
	if c.dead || c.shutting {
		c.mu.Unlock()
		return
	}
	c.shutting, c.closing = true, true
	streams := append([]*h2stream(nil), c.streams...)
	none := len(c.streams) == 0
	c.mu.Unlock()
	c.goAway(errNo, c.lastID.Load())
	if none {
		c.goAwayAndDrain(errNo)
		return
	}
	for _, st := range streams {
		st.signal(evShutdown)
	}
}

// keepalive PINGs the connection when it was quiet for h2KeepaliveTime,
// and closes it when a PING sent was not acknowledged within
// h2KeepaliveTimeout.
func (c *h2conn) keepalive(now time.Time) {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	if !c.pingAt.IsZero() {
		dead := now.Sub(c.pingAt) > c.t.keepTimeout
		c.mu.Unlock()
		if dead {
			c.t.connLog.Do(func() {
				c.t.log.Warn("xDS connection closed: its PING was not acknowledged (a few such lines a minute at most)",
					"remote", c.remote, "within", c.t.keepTimeout.String())
			})
			// Its own goroutine: the GOAWAY may wait a second on a
			// write, and the next connection is not to wait for it.
			// The socket itself is closed: closing a TLS connection
			// would wait on its close notice.
			go func() {
				c.goAway(errNo, c.lastID.Load())
				_ = c.raw.Close()
			}()
		}
		return
	}
	if now.Sub(time.Unix(0, c.lastRead.Load())) < c.t.keepTime {
		c.mu.Unlock()
		return
	}
	c.pingAt = now
	c.ctrl = append(appendFrameHeader(c.ctrl, 8, framePing, 0, 0), keepalivePing[:]...)
	start := c.kickLocked()
	c.mu.Unlock()
	c.startWriter(start)
}

// pong takes a PING's acknowledgement.
func (c *h2conn) pong(p []byte) {
	if [8]byte(p) != keepalivePing {
		return
	}
	c.mu.Lock()
	c.pingAt = time.Time{}
	c.mu.Unlock()
}

// pingBudget spends one of the client's PINGs and SETTINGS, or ends the
// connection when none is left (the reader's own).
func (c *h2conn) pingBudget(now time.Time) error {
	const every = time.Second / h2PingRate
	switch add := now.Sub(c.budgetAt) / every; {
	case c.budgetAt.IsZero() || add >= h2PingBurst:
		c.tokens, c.budgetAt = h2PingBurst, now
	case add > 0:
		// What is left of an interval counts toward the next token.
		c.tokens = min(h2PingBurst, c.tokens+int32(add))
		c.budgetAt = c.budgetAt.Add(add * every)
	}
	c.mu.Lock()
	c.tokens = min(h2PingBurst, c.tokens+c.earned)
	c.earned = 0
	c.mu.Unlock()
	if c.tokens <= 0 {
		return connError{errEnhanceCalm, "PING and SETTINGS frames faster than 10 a second"}
	}
	c.tokens--
	return nil
}

// growBlock appends p to the header block being read, within the bound
// of every connection's blocks.
func (c *h2conn) growBlock(p []byte) error {
	if c.block == nil {
		c.block = make([]byte, 0, len(p)+1024)
	}
	if need := len(c.block) + len(p); need > cap(c.block) {
		grown := make([]byte, len(c.block), max(need, 2*cap(c.block)))
		copy(grown, c.block)
		c.block = grown
	}
	if err := c.holdBlock(cap(c.block)); err != nil {
		c.block = nil
		c.holdBlock(0)
		return err
	}
	c.block = append(c.block, p...)
	return nil
}

// holdBlock counts n bytes of header block as the connection's in the
// transport's total, or fails when that would pass h2MaxBlockBytes.
func (c *h2conn) holdBlock(n int) error {
	delta := int64(n - c.blockHeld)
	if delta == 0 {
		return nil
	}
	// Compare and swap: the total never passes the bound, not even for
	// the moment an add would take to be taken back.
	for {
		total := c.t.blockBytes.Load()
		if delta > 0 && total+delta > c.t.maxBlocks {
			return connError{errEnhanceCalm, "header blocks begun and not ended over 64 MiB on the server"}
		}
		if c.t.blockBytes.CompareAndSwap(total, total+delta) {
			break
		}
	}
	c.blockHeld = n
	return nil
}
