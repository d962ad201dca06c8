package xds

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	gosync "sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"
)

// The server's own HTTP/2 (RFC 9113), the part that gRPC's one method
// here needs: a connection costs one goroutine, its reader, which parks
// on a 9-byte frame header; frames are read into pooled buffers; a
// stream's requests and pushes run in a goroutine started when there is
// something to do (see h2stream.run), which writes what it sends; other
// frames are written by a goroutine started when there are some, gone
// once they are written.
// At rest a client holds its connection's reader, a few hundred bytes of
// connection and stream state, and its ADS state.

// HTTP/2 frame types and flags.
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	framePriority     = 0x2
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePushPromise  = 0x5
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20
)

// HTTP/2 error codes.
const (
	errNo            = 0x0
	errProtocol      = 0x1
	errInternal      = 0x2
	errFlowControl   = 0x3
	errStreamClosed  = 0x5
	errFrameSize     = 0x6
	errRefusedStream = 0x7
	errCancel        = 0x8
	errCompression   = 0x9
	errEnhanceCalm   = 0xb
)

// h2Preface is what a client sends first.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

const (
	// h2MaxStreams is the most streams open at once on a connection: a
	// gRPC client holds one ADS stream on it.
	h2MaxStreams = 4
	// h2MaxFrame is the largest frame read (the protocol's default
	// SETTINGS_MAX_FRAME_SIZE, not raised), and written.
	h2MaxFrame = 16384
	// h2Window is the initial flow-control window, both ways (the
	// protocol's default, not changed).
	h2Window = 65535
	// h2MaxHeaderList bounds a request's header list (decoded), and its
	// header block (encoded).
	h2MaxHeaderList = 64 << 10
	// h2MaxControl bounds the control frames (settings and ping
	// acknowledgements, window updates, resets) waiting to be written: a
	// client that asks for them faster than it reads is closed.
	h2MaxControl = 64 << 10
)

// h2PrefaceTimeout bounds the client's preface; h2IdleTimeout closes a
// connection without a stream; h2FrameTimeout bounds the read of a
// frame's payload once its header came, and of a header block once
// begun. Variables for the tests.
var (
	h2PrefaceTimeout = 10 * time.Second
	h2IdleTimeout    = 30 * time.Second
	h2FrameTimeout   = 10 * time.Second
)

// framePool holds the buffers that frames' payloads are read into: a
// connection holds one only while it reads a frame.
var framePool = gosync.Pool{New: func() any { return new([h2MaxFrame]byte) }}

// h2conn is one client connection.
type h2conn struct {
	t   *Transport
	nc  net.Conn // read and written: the TLS connection, or the TCP one
	raw net.Conn // the connection accepted
	xc  *xconn   // nil when the listener is not Listener's
	// remote is the client's address.
	remote string

	// The reader's own.
	head        [9]byte
	dec         *hpack.Decoder
	fields      headerFields // of the header block being decoded
	block       []byte       // a header block continued, nil at rest
	blockStream uint32
	blockEnd    bool // the HEADERS that started block ended the stream
	// blockWhy: why the HEADERS that started block is malformed (a
	// priority on itself), "" when it is not.
	blockWhy string
	// blockDeadline: when block is to be whole (zero: no block begun).
	blockDeadline time.Time
	lastID        atomic.Uint32 // the highest stream id the client opened (read by a GOAWAY of the idle timer)
	recvWindow    int32         // what the client may still send on the connection
	owed          int32         // credit of the connection not yet given back

	wmu gosync.Mutex // held while writing to nc
	// broken: a write to nc failed (under wmu); shut: the writing side
	// is closed, and what is left to write is dropped (under wmu);
	// goingAway: a GOAWAY waits to be written, and writes get a second,
	// not sendTimeout; goneAway: a GOAWAY was written (or the
	// connection ends without one).
	broken, shut bool
	goingAway    atomic.Bool
	goneAway     atomic.Bool
	// draining: the reader reads what comes until drainAt (unix
	// nanoseconds), and the connection ends.
	draining atomic.Bool
	drainAt  atomic.Int64

	// The reader's own: the first frame came (a SETTINGS), the budget
	// of PINGs and SETTINGS (see pingBudget), the bytes of block counted
	// in the transport's blockBytes.
	started   bool
	tokens    int32
	budgetAt  time.Time
	blockHeld int
	// lastRead is when the reader last read a frame (unix nanoseconds):
	// the keepalive pings a connection quiet longer than
	// h2KeepaliveTime.
	lastRead atomic.Int64

	mu         gosync.Mutex
	streams    []*h2stream // open, or with frames still to write
	sendWindow int64       // of the connection, for DATA written
	peerWindow int32       // the client's initial stream window
	peerFrame  int         // the largest frame the client takes
	ctrl       []byte      // control frames to write
	writing    bool        // a writer runs
	dead       bool        // read side ended: streams gone, nc to close
	closing    bool        // going away: no stream is opened
	shutting   bool        // shutting down: closed once its streams ended
	idle       *time.Timer // closes a connection without a stream
	pingAt     time.Time   // a keepalive PING sent and not acknowledged
	earned     int32       // PINGs the DATA written since the reader last counted them earned (see pingBudget)
}

// serveH2 serves the HTTP/2 connection nc (xc its place in the limits,
// or nil; raw the connection accepted, under TLS or nc) until it ends.
func (t *Transport) serveH2(nc net.Conn, xc *xconn, raw net.Conn) {
	c := &h2conn{t: t, nc: nc, raw: raw, xc: xc, remote: nc.RemoteAddr().String(), recvWindow: h2Window,
		sendWindow: h2Window, peerWindow: h2Window, peerFrame: h2MaxFrame}
	c.dec = hpack.NewDecoder(4096, c.emit)
	c.dec.SetMaxStringLength(h2MaxHeaderList)
	if err := c.preface(); err != nil {
		c.end(err)
		return
	}
	c.lastRead.Store(time.Now().UnixNano())
	if !c.t.register(c) {
		c.end(c.fail(connError{errNo, "the server is shutting down"}))
		return
	}
	if xc != nil {
		xc.handshaken()
	}
	c.loop()
}

// loop reads frames until the connection ends. It parks on a frame's
// header with a shallow stack: after a frame whose handling goes deep
// (headers, requests, settings) it goes on in a new goroutine, and this
// one ends, its grown stack with it. At rest a connection holds a
// goroutine of the smallest stack.
func (c *h2conn) loop() {
	for {
		if _, err := io.ReadFull(c.nc, c.head[:]); err != nil {
			c.end(err)
			return
		}
		deep, err := c.next()
		if err != nil {
			c.end(err)
			return
		}
		if deep {
			go c.loop()
			return
		}
	}
}

// connError ends a connection with a GOAWAY of code.
type connError struct {
	code uint32
	why  string
}

func (e connError) Error() string {
	return "HTTP/2 connection error " + strconv.Itoa(int(e.code)) + ": " + e.why
}

// preface reads the client's preface and queues the server's settings.
func (c *h2conn) preface() error {
	var preface [len(h2Preface)]byte
	_ = c.nc.SetReadDeadline(time.Now().Add(h2PrefaceTimeout))
	if _, err := io.ReadFull(c.nc, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != h2Preface {
		c.goneAway.Store(true) // not HTTP/2: no GOAWAY, but the drain
		return connError{errProtocol, "not the HTTP/2 client preface (this port speaks gRPC over HTTP/2 only)"}
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	// Our settings: at most h2MaxStreams streams, and the header list
	// bound; the windows and frame size stay the protocol's defaults.
	settings := appendFrameHeader(nil, 12, frameSettings, 0, 0)
	settings = binary.BigEndian.AppendUint16(settings, 0x3)
	settings = binary.BigEndian.AppendUint32(settings, h2MaxStreams)
	settings = binary.BigEndian.AppendUint16(settings, 0x6)
	settings = binary.BigEndian.AppendUint32(settings, h2MaxHeaderList)
	c.mu.Lock()
	c.ctrl = settings
	c.idleLocked()
	start := c.kickLocked()
	c.mu.Unlock()
	c.startWriter(start)
	return nil
}

// next reads the payload of the frame whose header is c.head and
// handles the frame; deep reports a frame whose handling may have grown
// the stack.
func (c *h2conn) next() (deep bool, err error) {
	n := int(c.head[0])<<16 | int(c.head[1])<<8 | int(c.head[2])
	typ, flags := c.head[3], c.head[4]
	id := binary.BigEndian.Uint32(c.head[5:]) & 0x7fffffff
	if n > h2MaxFrame {
		return false, c.fail(connError{errFrameSize, fmt.Sprintf("a frame of %d bytes, over %d", n, h2MaxFrame)})
	}
	if !c.started {
		// The client's preface ends with a SETTINGS frame (§3.4).
		if typ != frameSettings || flags&flagAck != 0 {
			return false, c.fail(connError{errProtocol, "the first frame is not SETTINGS"})
		}
		c.started = true
	}
	var buf *[h2MaxFrame]byte
	var p []byte
	if n > 0 {
		buf = framePool.Get().(*[h2MaxFrame]byte)
		defer framePool.Put(buf)
		p = buf[:n]
		deadline := time.Now().Add(h2FrameTimeout)
		if rest := c.restDeadline(); !rest.IsZero() && rest.Before(deadline) {
			deadline = rest
		}
		_ = c.nc.SetReadDeadline(deadline)
		_, err := io.ReadFull(c.nc, p)
		c.setRestDeadline()
		if err != nil {
			return false, err
		}
	}
	c.lastRead.Store(time.Now().UnixNano())
	if err := c.frame(typ, flags, id, p); err != nil {
		var ce connError
		if errors.As(err, &ce) {
			return false, c.fail(ce)
		}
		return false, err
	}
	return typ == frameHeaders || typ == frameContinuation || typ == frameData || typ == frameSettings, nil
}

// frame handles one frame.
func (c *h2conn) frame(typ, flags byte, id uint32, p []byte) error {
	if c.block != nil && typ != frameContinuation {
		return connError{errProtocol, "a frame inside a header block"}
	}
	switch typ {
	case frameData:
		return c.data(flags, id, p)
	case frameHeaders:
		return c.headers(flags, id, p)
	case frameContinuation:
		if c.block == nil || id != c.blockStream {
			return connError{errProtocol, "CONTINUATION without its HEADERS"}
		}
		if len(c.block)+len(p) > h2MaxHeaderList {
			return connError{errEnhanceCalm, "a header block over 64 KiB"}
		}
		if err := c.growBlock(p); err != nil {
			return err
		}
		if flags&flagEndHeaders != 0 {
			block := c.block
			c.block, c.blockDeadline = nil, time.Time{}
			c.holdBlock(0)
			c.setRestDeadline()
			return c.open(c.blockStream, c.blockEnd, block, c.blockWhy)
		}
		return nil
	case framePriority:
		return c.priority(id, p)
	case frameRSTStream:
		if id == 0 {
			return connError{errProtocol, "RST_STREAM without a stream"}
		}
		if len(p) != 4 {
			return connError{errFrameSize, "an RST_STREAM frame not of 4 bytes"}
		}
		if c.idleStream(id) {
			return connError{errProtocol, "RST_STREAM on an idle stream"}
		}
		c.mu.Lock()
		st := c.streamLocked(id)
		var start bool
		if st != nil && !st.reset {
			start = st.resetLocked(0) // nothing more is written to it
		}
		c.mu.Unlock()
		st.start(start)
		return nil
	case frameSettings:
		return c.settings(flags, id, p)
	case framePushPromise:
		return connError{errProtocol, "a client's PUSH_PROMISE"}
	case framePing:
		return c.ping(flags, id, p)
	case frameGoAway:
		if id != 0 {
			return connError{errProtocol, "GOAWAY on a stream"}
		}
		return nil // the client closes the connection next
	case frameWindowUpdate:
		if len(p) != 4 {
			return connError{errFrameSize, "a bad WINDOW_UPDATE frame"}
		}
		return c.windowUpdate(id, int64(binary.BigEndian.Uint32(p)&0x7fffffff))
	}
	return nil // an unknown type is ignored
}

// settings applies the client's settings and acknowledges them.
func (c *h2conn) settings(flags byte, id uint32, p []byte) error {
	if id != 0 {
		return connError{errProtocol, "SETTINGS on a stream"}
	}
	if flags&flagAck != 0 {
		if len(p) != 0 {
			return connError{errFrameSize, "a SETTINGS acknowledgement with a payload"}
		}
		return nil
	}
	if len(p)%6 != 0 {
		return connError{errFrameSize, "a SETTINGS frame of a length not a multiple of 6"}
	}
	if err := c.pingBudget(time.Now()); err != nil {
		return err
	}
	c.mu.Lock()
	for ; len(p) > 0; p = p[6:] {
		v := binary.BigEndian.Uint32(p[2:])
		switch binary.BigEndian.Uint16(p) {
		case 0x2: // ENABLE_PUSH
			if v > 1 {
				c.mu.Unlock()
				return connError{errProtocol, "SETTINGS_ENABLE_PUSH not 0 or 1"}
			}
		case 0x4: // INITIAL_WINDOW_SIZE
			if v > 1<<31-1 {
				c.mu.Unlock()
				return connError{errFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1"}
			}
			delta := int64(v) - int64(c.peerWindow)
			for _, st := range c.streams {
				if st.sendWindow+delta > 1<<31-1 {
					c.mu.Unlock()
					return connError{errFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE takes a stream's window over 2^31-1"}
				}
			}
			c.peerWindow = int32(v)
			for _, st := range c.streams {
				st.sendWindow += delta
			}
		case 0x5: // MAX_FRAME_SIZE
			if v < 16384 || v > 1<<24-1 {
				c.mu.Unlock()
				return connError{errProtocol, "SETTINGS_MAX_FRAME_SIZE out of range"}
			}
			c.peerFrame = int(min(v, h2MaxFrame))
		}
	}
	c.mu.Unlock()
	return c.control(appendFrameHeader(nil, 0, frameSettings, flagAck, 0))
}

// control queues a control frame.
func (c *h2conn) control(f []byte) error {
	c.mu.Lock()
	if len(c.ctrl)+len(f) > h2MaxControl {
		c.mu.Unlock()
		return connError{errEnhanceCalm, "control frames asked for faster than they are read"}
	}
	c.ctrl = append(c.ctrl, f...)
	start := c.kickLocked()
	c.mu.Unlock()
	c.startWriter(start)
	return nil
}

// unpad is a padded frame's payload without its padding, and the bytes
// of padding (its length byte counted).
func unpad(flags byte, p []byte) ([]byte, int32, error) {
	if flags&flagPadded == 0 {
		return p, 0, nil
	}
	if len(p) < 1 || int(p[0]) >= len(p) {
		return nil, 0, connError{errProtocol, "bad padding"}
	}
	return p[1 : len(p)-int(p[0])], int32(p[0]) + 1, nil
}

// headers starts a header block; open takes it once whole.
func (c *h2conn) headers(flags byte, id uint32, p []byte) error {
	if id == 0 {
		return connError{errProtocol, "HEADERS without a stream"}
	}
	p, _, err := unpad(flags, p)
	if err != nil {
		return err
	}
	why := ""
	if flags&flagPriority != 0 {
		if len(p) < 5 {
			return connError{errProtocol, "a bad HEADERS priority"}
		}
		if binary.BigEndian.Uint32(p)&0x7fffffff == id {
			why = "a stream that depends on itself"
		}
		p = p[5:]
	}
	end := flags&flagEndStream != 0
	if flags&flagEndHeaders != 0 {
		return c.open(id, end, p, why)
	}
	if err := c.growBlock(p); err != nil {
		return err
	}
	c.blockStream, c.blockEnd, c.blockWhy = id, end, why
	// A header block is to be whole within h2FrameTimeout: one begun
	// and never ended would hold what it has read for good.
	c.blockDeadline = time.Now().Add(h2FrameTimeout)
	c.setRestDeadline()
	return nil
}

// openLocked is the number of streams open: those the client reset are
// not, though their goroutines may not have let them go yet (under
// c.mu). A stream reset and one opened at once are not refused; the
// streams kept until let go are bounded apart.
func (c *h2conn) openLocked() int {
	n := 0
	for _, st := range c.streams {
		if !st.reset {
			n++
		}
	}
	return n
}

// streamLocked is the stream id, or nil (under c.mu).
func (c *h2conn) streamLocked(id uint32) *h2stream {
	for _, st := range c.streams {
		if st.id == id {
			return st
		}
	}
	return nil
}
