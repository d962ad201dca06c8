package xds

import (
	"encoding/binary"
	"net"
	"strconv"
	gosync "sync"
	"time"
)

// The writing half of the server's HTTP/2: a connection's writer, and
// the frames and header blocks it writes.

// kickLocked reports whether a writer is to start (under c.mu): there is
// something to write and none runs.
func (c *h2conn) kickLocked() bool {
	if c.writing || c.dead || !c.writableLocked() {
		return false
	}
	c.writing = true
	return true
}

// writableLocked reports whether some frame can be written now.
func (c *h2conn) writableLocked() bool {
	if len(c.ctrl) > 0 {
		return true
	}
	for _, st := range c.streams {
		if st.head != nil || st.rst != 0 || len(st.out) > 0 && st.sendWindow > 0 && c.sendWindow > 0 || len(st.out) == 0 && st.tail != nil {
			return true
		}
	}
	return false
}

func (c *h2conn) startWriter(start bool) {
	if start {
		go c.write(nil)
	}
}

// write writes what there is to write, then ends: the connection holds
// no writer at rest. With own, the stream whose goroutine writes its own
// message: once that message is out, what else there is goes to a
// writer of its own, so that the stream's goroutine is not kept writing
// for the others.
func (c *h2conn) write(own *h2stream) {
	for round := 0; ; round++ {
		c.mu.Lock()
		if c.dead {
			c.writing = false
			c.mu.Unlock()
			return
		}
		if own != nil && round > 0 && len(own.out) == 0 {
			if c.writableLocked() {
				c.mu.Unlock()
				go c.write(nil) // the writer's part goes with it
				return
			}
			c.writing = false
			c.mu.Unlock()
			return
		}
		bufs, done := c.collectLocked()
		if len(bufs) == 0 {
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		// One write of every frame: net.Buffers would write each part
		// apart on a TLS or limited connection (a 9-byte frame header a
		// packet, or a record).
		bp := writePool.Get().(*[]byte)
		b := (*bp)[:0]
		for _, p := range bufs {
			b = append(b, p...)
		}
		c.wmu.Lock()
		var err error
		switch {
		case c.shut:
			// The writing side is closed (a GOAWAY went): dropped.
		case c.broken:
			err = net.ErrClosed
		default:
			within := time.Duration(sendTimeout.Load())
			if c.goingAway.Load() {
				within = time.Second // a GOAWAY waits on this write
			}
			_ = c.nc.SetWriteDeadline(time.Now().Add(within))
			if _, err = c.nc.Write(b); err != nil {
				// What was written of b may end inside a frame:
				// nothing is written after it.
				c.broken = true
			}
		}
		c.wmu.Unlock()
		if cap(b) <= 256<<10 {
			*bp = b[:0]
			writePool.Put(bp)
		}
		if err != nil {
			// A client that reads nothing for sendTimeout, or a
			// connection gone: the reader sees it closed and ends it.
			_ = c.nc.Close()
			c.mu.Lock()
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.mu.Lock()
		var starts []*h2stream
		var hooks []func()
		for _, w := range done {
			if w.written != nil {
				hooks = append(hooks, w.written)
			}
			st := w.st
			if len(st.out) == 0 && st.timer != nil {
				st.timer.Stop()
			}
			if st.finished && st.idleLocked() {
				c.removeLocked(st)
				continue
			}
			if st.signalLocked(0) {
				starts = append(starts, st)
			}
		}
		c.mu.Unlock()
		for _, f := range hooks {
			f() // a response written: its sender is told (Stream.Send)
		}
		for _, st := range starts {
			st.start(true)
		}
	}
}

// writePool holds the buffers that a write gathers its frames in.
var writePool = gosync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// written is what a write finished for a stream: a message (with the
// hook its sender gave, or nil), its headers or trailers.
type written struct {
	st      *h2stream
	written func()
}

// collectLocked takes the frames that can be written now, in order.
func (c *h2conn) collectLocked() (net.Buffers, []written) {
	var bufs net.Buffers
	var done []written
	if len(c.ctrl) > 0 {
		bufs = append(bufs, c.ctrl)
		c.ctrl = nil
	}
	for _, st := range c.streams {
		touched := false
		if st.rst != 0 {
			bufs = append(bufs, rstFrame(st.id, st.rst))
			st.rst = 0
			touched = true
		}
		if st.head != nil {
			bufs = append(bufs, appendFrameHeader(nil, len(st.head), frameHeaders, flagEndHeaders, st.id), st.head)
			st.head = nil
			touched = true
		}
		for len(st.out) > 0 && st.sendWindow > 0 && c.sendWindow > 0 {
			m := st.out[0]
			n := min(int64(len(m.b)-st.off), st.sendWindow, c.sendWindow, int64(c.peerFrame))
			var flags byte
			if st.endData && len(st.out) == 1 && st.off+int(n) == len(m.b) {
				flags = flagEndStream
			}
			bufs = append(bufs, appendFrameHeader(nil, int(n), frameData, flags, st.id), m.b[st.off:st.off+int(n)])
			if n >= 1024 || !st.endData && st.off+int(n) == len(m.b) {
				c.earned = min(c.earned+1, h2PingBurst)
			}
			st.off += int(n)
			st.sendWindow -= n
			c.sendWindow -= n
			if st.off == len(m.b) {
				st.out[0] = outMsg{}
				st.out = st.out[1:]
				st.off = 0
				done = append(done, written{st, m.written})
				touched = false
				if flags != 0 {
					bufs = st.endedLocked(bufs)
					touched = true
				}
			}
		}
		if len(st.out) == 0 {
			st.out = nil
			if st.tail != nil {
				bufs = append(bufs, appendFrameHeader(nil, len(st.tail), frameHeaders, flagEndHeaders|flagEndStream, st.id), st.tail)
				st.tail = nil
				bufs = st.endedLocked(bufs)
				touched = true
			}
		}
		if touched {
			done = append(done, written{st: st})
		}
	}
	return bufs, done
}

// endedLocked follows the frame that ended the server's side of st: a
// client that has not ended its own is told with a RST_STREAM of
// NO_ERROR to stop sending (RFC 9113 §8.1), and the stream is closed.
func (st *h2stream) endedLocked(bufs net.Buffers) net.Buffers {
	st.ended = true
	if st.remoteDone || st.reset {
		return bufs
	}
	st.reset, st.rstSent = true, true
	return append(bufs, rstFrame(st.id, errNo))
}

// removeLocked forgets a stream that ended and whose frames are written.
func (c *h2conn) removeLocked(st *h2stream) {
	for i, s := range c.streams {
		if s == st {
			c.streams = append(c.streams[:i], c.streams[i+1:]...)
			c.streams[len(c.streams):cap(c.streams)][0] = nil
			break
		}
	}
	if len(c.streams) == 0 {
		c.streams = nil
		c.idleLocked()
	}
}

// appendFrameHeader appends a frame's 9-byte header.
func appendFrameHeader(b []byte, n int, typ, flags byte, id uint32) []byte {
	b = append(b, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	return binary.BigEndian.AppendUint32(b, id)
}

func rstFrame(id, code uint32) []byte {
	return binary.BigEndian.AppendUint32(appendFrameHeader(nil, 4, frameRSTStream, 0, id), code)
}

func windowFrame(b []byte, id, inc uint32) []byte {
	return binary.BigEndian.AppendUint32(appendFrameHeader(b, 4, frameWindowUpdate, 0, id), inc)
}

// The response's header blocks, in HPACK without the dynamic table: the
// server keeps no encoder state per connection.

// responseHead is ":status: 200" and "content-type: application/grpc".
var responseHead = hpackField([]byte{0x88}, "", "application/grpc", 31)

// hpackField appends a literal field without indexing: of the static
// table's name idx when idx > 0, else of name.
func hpackField(b []byte, name, value string, idx int) []byte {
	switch {
	case idx > 0:
		b = hpackInt(b, 0x00, 4, idx)
	case idx == 0:
		b = append(b, 0x00)
		b = hpackInt(b, 0x00, 7, len(name))
		b = append(b, name...)
	default:
		return b
	}
	b = hpackInt(b, 0x00, 7, len(value))
	return append(b, value...)
}

// hpackInt appends an HPACK integer of an n-bit prefix, with the first
// byte's other bits from first.
func hpackInt(b []byte, first byte, n uint, v int) []byte {
	max := 1<<n - 1
	if v < max {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(max))
	for v -= max; v >= 128; v >>= 7 {
		b = append(b, byte(v&0x7f|0x80))
	}
	return append(b, byte(v))
}

// trailers is the header block that ends a stream with code and message;
// with head, the response's headers come first (a response of trailers
// alone).
func trailers(head bool, code int, message string) []byte {
	var b []byte
	if head {
		b = append(b, responseHead...)
	}
	b = hpackField(b, "grpc-status", strconv.Itoa(code), 0)
	if message != "" {
		if len(message) > 1024 {
			message = message[:1024]
		}
		b = hpackField(b, "grpc-message", encodeMessage(message), 0)
	}
	return b
}

// plainHead is the header block of a plain response of status code
// (":status" of the static table's index 8) with a text body.
func plainHead(code int) []byte {
	b := hpackField(nil, "", strconv.Itoa(code), 8)
	return hpackField(b, "", "text/plain; charset=utf-8", 31)
}
