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
	// blockDeadline: when block is to be whole (zero: no block begun).
	blockDeadline time.Time
	lastID        atomic.Uint32 // the highest stream id the client opened (read by a GOAWAY of the idle timer)
	recvWindow    int32         // what the client may still send on the connection
	owed          int32         // credit of the connection not yet given back

	wmu gosync.Mutex // held while writing to nc
	// broken: a write to nc failed (under wmu); goingAway: a GOAWAY
	// waits to be written, and writes get a second, not sendTimeout.
	broken    bool
	goingAway atomic.Bool

	mu         gosync.Mutex
	streams    []*h2stream // open, or with frames still to write
	sendWindow int64       // of the connection, for DATA written
	peerWindow int32       // the client's initial stream window
	peerFrame  int         // the largest frame the client takes
	ctrl       []byte      // control frames to write
	writing    bool        // a writer runs
	dead       bool        // read side ended: streams gone, nc to close
	closing    bool        // closed for idleness: no stream is opened
	idle       *time.Timer // closes a connection without a stream
}

// headerFields is what a request's header block says.
type headerFields struct {
	method, path, contentType, encoding, auth string
	size                                      int // decoded, as RFC 9113 counts it
	bad                                       bool
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

// end ends the connection once its reader ended for err.
func (c *h2conn) end(err error) {
	c.teardown()
	c.t.closeConn(c.raw)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		var ce connError
		if errors.As(err, &ce) {
			c.t.s.connLog.Do(func() {
				c.t.s.log.Warn("xDS connection trouble (a few such lines a minute at most)", "remote", c.remote, "error", err.Error())
			})
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
		return c.fail(connError{errProtocol, "not the HTTP/2 client preface (this port speaks gRPC over HTTP/2 only)"})
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
	var buf *[h2MaxFrame]byte
	var p []byte
	if n > 0 {
		buf = framePool.Get().(*[h2MaxFrame]byte)
		defer framePool.Put(buf)
		p = buf[:n]
		deadline := time.Now().Add(h2FrameTimeout)
		if !c.blockDeadline.IsZero() && c.blockDeadline.Before(deadline) {
			deadline = c.blockDeadline
		}
		_ = c.nc.SetReadDeadline(deadline)
		_, err := io.ReadFull(c.nc, p)
		_ = c.nc.SetReadDeadline(c.blockDeadline) // zero: none
		if err != nil {
			return false, err
		}
	}
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
		c.block = append(c.block, p...)
		if flags&flagEndHeaders != 0 {
			block := c.block
			c.block, c.blockDeadline = nil, time.Time{}
			_ = c.nc.SetReadDeadline(time.Time{})
			return c.open(c.blockStream, c.blockEnd, block)
		}
		return nil
	case framePriority:
		if id == 0 || len(p) != 5 {
			return connError{errProtocol, "a bad PRIORITY frame"}
		}
		return nil
	case frameRSTStream:
		if id == 0 || len(p) != 4 {
			return connError{errProtocol, "a bad RST_STREAM frame"}
		}
		c.mu.Lock()
		st := c.streamLocked(id)
		var start bool
		if st != nil {
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
		if id != 0 || len(p) != 8 {
			return connError{errProtocol, "a bad PING frame"}
		}
		if flags&flagAck != 0 {
			return nil
		}
		return c.control(append(appendFrameHeader(nil, 8, framePing, flagAck, 0), p...))
	case frameGoAway:
		return nil // the client closes the connection next
	case frameWindowUpdate:
		if len(p) != 4 {
			return connError{errFrameSize, "a bad WINDOW_UPDATE frame"}
		}
		inc := int64(binary.BigEndian.Uint32(p) & 0x7fffffff)
		if inc == 0 {
			return connError{errProtocol, "a WINDOW_UPDATE of 0"}
		}
		c.mu.Lock()
		if id == 0 {
			c.sendWindow += inc
			if c.sendWindow > 1<<31-1 {
				c.mu.Unlock()
				return connError{errFlowControl, "the connection's window over 2^31-1"}
			}
		} else if st := c.streamLocked(id); st != nil {
			st.sendWindow += inc
			if st.sendWindow > 1<<31-1 {
				c.mu.Unlock()
				return connError{errFlowControl, "a stream's window over 2^31-1"}
			}
		}
		start := c.kickLocked()
		c.mu.Unlock()
		c.startWriter(start)
		return nil
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
	if flags&flagPriority != 0 {
		if len(p) < 5 {
			return connError{errProtocol, "a bad HEADERS priority"}
		}
		p = p[5:]
	}
	end := flags&flagEndStream != 0
	if flags&flagEndHeaders != 0 {
		return c.open(id, end, p)
	}
	c.block = append(make([]byte, 0, len(p)+1024), p...)
	c.blockStream, c.blockEnd = id, end
	// A header block is to be whole within h2FrameTimeout: one begun
	// and never ended would hold what it has read for good.
	c.blockDeadline = time.Now().Add(h2FrameTimeout)
	_ = c.nc.SetReadDeadline(c.blockDeadline)
	return nil
}

// emit takes one decoded header field.
func (c *h2conn) emit(f hpack.HeaderField) {
	h := &c.fields
	h.size += len(f.Name) + len(f.Value) + 32
	if h.size > h2MaxHeaderList {
		h.bad = true
		c.dec.SetEmitEnabled(false)
		return
	}
	switch f.Name {
	case ":method":
		h.method = f.Value
	case ":path":
		h.path = f.Value
	case "content-type":
		h.contentType = f.Value
	case "grpc-encoding":
		h.encoding = f.Value
	case "authorization":
		h.auth = f.Value
	}
}

// hpackRelease is an indexed field of the static table (":method: GET"):
// decoding it changes no state.
var hpackRelease = []byte{0x82}

// open decodes a whole header block and opens its stream.
func (c *h2conn) open(id uint32, end bool, block []byte) error {
	c.fields = headerFields{}
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
	if id%2 == 0 || id <= c.lastID.Load() {
		c.mu.Lock()
		st := c.streamLocked(id)
		if st == nil {
			c.mu.Unlock()
			return connError{errProtocol, "HEADERS of a stream closed or not the client's"}
		}
		// Trailers of a request: gRPC sends none on this method.
		var start bool
		if !st.gone() {
			start = st.resetLocked(errProtocol)
		}
		startW := c.kickLocked()
		c.mu.Unlock()
		st.start(start)
		c.startWriter(startW)
		return nil
	}
	c.lastID.Store(id)
	if h.bad {
		return c.control(rstFrame(id, errRefusedStream))
	}
	c.mu.Lock()
	if c.dead || c.closing || c.openLocked() >= h2MaxStreams || len(c.streams) >= 4*h2MaxStreams {
		c.mu.Unlock()
		return c.control(rstFrame(id, errRefusedStream))
	}
	st := &h2stream{c: c, id: id, sendWindow: int64(c.peerWindow), recvWindow: h2Window, req: &h, ev: evOpen}
	if end {
		st.ev |= evEOF
		st.remoteDone = true
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

// data takes a DATA frame's bytes into its stream's messages.
func (c *h2conn) data(flags byte, id uint32, p []byte) error {
	if id == 0 {
		return connError{errProtocol, "DATA without a stream"}
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
	if st == nil || st.remoteDone || st.gone() || st.recvErr != nil {
		var start bool
		if st != nil && st.remoteDone && !st.gone() {
			// DATA after the client ended its side: the stream is reset.
			start = st.resetLocked(errStreamClosed)
		}
		c.mu.Unlock()
		st.start(start)
		if ctrl != nil {
			if err := c.control(ctrl); err != nil {
				return err
			}
		}
		if st == nil && (id > c.lastID.Load() || id%2 == 0) {
			return connError{errProtocol, "DATA on a stream never opened"}
		}
		if st == nil {
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

// idleLocked closes the connection after h2IdleTimeout without a stream
// (under c.mu, when it has none).
func (c *h2conn) idleLocked() {
	if c.dead {
		return
	}
	if c.idle == nil {
		c.idle = time.AfterFunc(h2IdleTimeout, func() {
			// Closing: a stream that comes now is refused (its client
			// may retry it elsewhere), not opened to be cut.
			c.mu.Lock()
			idle := len(c.streams) == 0 && !c.dead
			c.closing = c.closing || idle
			last := c.lastID.Load()
			c.mu.Unlock()
			if idle {
				c.goAway(errNo, last)
				_ = c.nc.Close()
			}
		})
		return
	}
	c.idle.Reset(h2IdleTimeout)
}

// fail sends a GOAWAY for e and returns e: the reader ends, and the
// connection with it.
func (c *h2conn) fail(e connError) error {
	c.goAway(e.code, c.lastID.Load())
	return e
}

// goAway writes a GOAWAY of code, the last stream handled last. A write
// under way is given a second to finish (its deadline is cut to that):
// the connection ends either way.
func (c *h2conn) goAway(code, last uint32) {
	c.goingAway.Store(true)
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.broken {
		return // a write failed, perhaps inside a frame
	}
	f := appendFrameHeader(nil, 8, frameGoAway, 0, 0)
	f = binary.BigEndian.AppendUint32(f, last)
	f = binary.BigEndian.AppendUint32(f, code)
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.nc.Write(f)
}

// teardown ends the connection once its reader ended: every stream is
// gone (each ends in its own goroutine), and the connection is closed.
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
	_ = c.nc.Close()
	for _, st := range starts {
		st.start(true)
	}
}
