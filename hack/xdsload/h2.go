package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// adsPath is the HTTP/2 path of StreamAggregatedResources.
const adsPath = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

// h2conn is one unencrypted HTTP/2 connection (prior knowledge, as
// gRPC's "insecure" credentials dial) carrying gRPC calls, framed by
// hand with x/net/http2's Framer: one goroutine per connection reads
// every frame and hands each call's messages to it, and whoever sends
// writes under wmu. A real HTTP/2 client as the server sees it
// (settings, flow control both ways, pings answered), at a fraction of
// a grpc-go ClientConn's memory and goroutines.
type h2conn struct {
	nc        net.Conn
	fr        *http2.Framer
	bw        *bufio.Writer
	authority string
	// window is what the connection advertises for each call and for
	// itself: received data is given back once half of it is used. 0:
	// the server may send no data on any call, ever.
	window uint32

	// settled is closed when the server's first SETTINGS arrives: it
	// accepted the connection.
	settled     chan struct{}
	settledOnce sync.Once
	done        chan struct{} // closed when the reader ends

	wmu      sync.Mutex
	henc     *hpack.Encoder
	hbuf     bytes.Buffer
	connSend int64 // the connection's send window
	peerInit int64 // the server's initial window of a call
	maxFrame int
	unacked  uint32 // received on the connection, not given back
	streams  map[uint32]*h2stream
	nextID   uint32
	err      error
}

// h2stream is one gRPC call on an h2conn.
type h2stream struct {
	c       *h2conn
	id      uint32
	window  int64  // its send window
	pending []byte // framed messages waiting for window
	buf     []byte // received, short of a whole message
	unacked uint32
	onMsg   func(s *h2stream, msg []byte, at time.Time)
	onEnd   func(error)
	ended   bool
}

// dialH2 connects to addr and sends the preface and its settings.
func dialH2(addr string, window uint32, timeout time.Duration) (*h2conn, error) {
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	c := &h2conn{
		nc: nc, bw: bufio.NewWriterSize(nc, 16<<10), authority: addr, window: window,
		settled: make(chan struct{}), done: make(chan struct{}),
		connSend: 65535, peerInit: 65535, maxFrame: 16384,
		streams: map[uint32]*h2stream{}, nextID: 1,
	}
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(nc, 16<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 64 << 10
	c.wmu.Lock()
	_, err = c.bw.WriteString(http2.ClientPreface)
	if err == nil {
		err = c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	}
	if err == nil && window > 65535 {
		err = c.fr.WriteWindowUpdate(0, window-65535)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		nc.Close()
		return nil, err
	}
	go c.read()
	return c, nil
}

// Close closes the connection; its calls end.
func (c *h2conn) Close() error { return c.nc.Close() }

// open starts a call of StreamAggregatedResources: onMsg gets each
// message of the response (in the reader's goroutine: it must not
// block), onEnd the error that ended the call, once.
func (c *h2conn) open(onMsg func(*h2stream, []byte, time.Time), onEnd func(error)) (*h2stream, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	s := &h2stream{c: c, id: c.nextID, window: c.peerInit, onMsg: onMsg, onEnd: onEnd}
	c.nextID += 2
	c.hbuf.Reset()
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", adsPath}, {":authority", c.authority},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"user-agent", "xdsload"},
	} {
		_ = c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		return nil, err
	}
	if err := c.bw.Flush(); err != nil {
		return nil, err
	}
	c.streams[s.id] = s
	return s, nil
}

// send writes one gRPC message on the call, as far as the windows allow
// now; the rest goes as the server gives window back.
func (s *h2stream) send(msg []byte) error {
	c := s.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.err != nil {
		return c.err
	}
	var head [5]byte
	binary.BigEndian.PutUint32(head[1:], uint32(len(msg)))
	s.pending = append(append(s.pending, head[:]...), msg...)
	return c.flush(s)
}

// flush writes what s holds back, within the windows (under wmu).
func (c *h2conn) flush(s *h2stream) error {
	for len(s.pending) > 0 && !s.ended {
		n := min(int64(len(s.pending)), c.connSend, s.window, int64(c.maxFrame))
		if n <= 0 {
			break
		}
		if err := c.fr.WriteData(s.id, false, s.pending[:n]); err != nil {
			return err
		}
		c.connSend -= n
		s.window -= n
		s.pending = s.pending[n:]
	}
	if len(s.pending) == 0 {
		s.pending = nil
	}
	return c.bw.Flush()
}

// read reads every frame until the connection fails, and then ends its
// calls.
func (c *h2conn) read() {
	defer close(c.done)
	err := c.readFrames()
	c.wmu.Lock()
	c.err = err
	streams := c.streams
	c.streams = nil
	c.wmu.Unlock()
	c.nc.Close()
	for _, s := range streams {
		s.end(err)
	}
}

func (c *h2conn) readFrames() error {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return err
		}
		at := time.Now()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			c.wmu.Lock()
			_ = f.ForeachSetting(func(s http2.Setting) error {
				switch s.ID {
				case http2.SettingInitialWindowSize:
					delta := int64(s.Val) - c.peerInit
					c.peerInit = int64(s.Val)
					for _, st := range c.streams {
						st.window += delta
					}
				case http2.SettingMaxFrameSize:
					c.maxFrame = int(s.Val)
				}
				return nil
			})
			err := c.fr.WriteSettingsAck()
			for _, st := range c.streams {
				if err == nil {
					err = c.flush(st)
				}
			}
			if err == nil {
				err = c.bw.Flush()
			}
			c.wmu.Unlock()
			c.settledOnce.Do(func() { close(c.settled) })
			if err != nil {
				return err
			}
		case *http2.PingFrame:
			if f.IsAck() {
				continue
			}
			c.wmu.Lock()
			err := c.fr.WritePing(true, f.Data)
			if err == nil {
				err = c.bw.Flush()
			}
			c.wmu.Unlock()
			if err != nil {
				return err
			}
		case *http2.WindowUpdateFrame:
			c.wmu.Lock()
			var err error
			if f.StreamID == 0 {
				c.connSend += int64(f.Increment)
				for _, st := range c.streams {
					if err == nil {
						err = c.flush(st)
					}
				}
			} else if st := c.streams[f.StreamID]; st != nil {
				st.window += int64(f.Increment)
				err = c.flush(st)
			}
			c.wmu.Unlock()
			if err != nil {
				return err
			}
		case *http2.DataFrame:
			c.wmu.Lock()
			st := c.streams[f.StreamID]
			var err error
			if c.window > 0 {
				c.unacked += f.Length
				if c.unacked >= c.window/2 {
					err = c.fr.WriteWindowUpdate(0, c.unacked)
					c.unacked = 0
				}
				if st != nil && !f.StreamEnded() {
					st.unacked += f.Length
					if st.unacked >= c.window/2 && err == nil {
						err = c.fr.WriteWindowUpdate(st.id, st.unacked)
						st.unacked = 0
					}
				}
				if err == nil {
					err = c.bw.Flush()
				}
			}
			c.wmu.Unlock()
			if err != nil {
				return err
			}
			if st == nil {
				continue
			}
			st.buf = append(st.buf, f.Data()...)
			for len(st.buf) >= 5 {
				n := int(binary.BigEndian.Uint32(st.buf[1:5]))
				if len(st.buf) < 5+n {
					break
				}
				st.onMsg(st, st.buf[5:5+n], at)
				st.buf = st.buf[5+n:]
			}
			if len(st.buf) == 0 {
				st.buf = nil // the next message gets a buffer of its size
			}
			if f.StreamEnded() {
				c.endStream(st, errors.New("the server ended the call without a status"))
			}
		case *http2.MetaHeadersFrame:
			if !f.StreamEnded() {
				continue // the response's headers
			}
			c.wmu.Lock()
			st := c.streams[f.StreamID]
			c.wmu.Unlock()
			if st != nil {
				c.endStream(st, grpcStatus(f))
			}
		case *http2.RSTStreamFrame:
			c.wmu.Lock()
			st := c.streams[f.StreamID]
			c.wmu.Unlock()
			if st != nil {
				c.endStream(st, fmt.Errorf("call reset: %v", f.ErrCode))
			}
		case *http2.GoAwayFrame:
			// The server ends the connection: its calls end with it.
		}
	}
}

// endStream forgets a call that the server ended.
func (c *h2conn) endStream(s *h2stream, err error) {
	c.wmu.Lock()
	delete(c.streams, s.id)
	c.wmu.Unlock()
	s.end(err)
}

func (s *h2stream) end(err error) {
	s.c.wmu.Lock()
	ended := s.ended
	s.ended = true
	s.c.wmu.Unlock()
	if !ended && s.onEnd != nil {
		s.onEnd(err)
	}
}

// grpcStatus is the error of a call's trailers, nil for OK.
func grpcStatus(f *http2.MetaHeadersFrame) error {
	code := f.PseudoValue("status")
	for _, h := range f.Fields {
		if h.Name == "grpc-status" {
			code = h.Value
		}
	}
	if code == "0" {
		return nil
	}
	msg := ""
	for _, h := range f.Fields {
		if h.Name == "grpc-message" {
			msg = h.Value
		}
	}
	n, _ := strconv.Atoi(code)
	return fmt.Errorf("grpc status %d: %s", n, msg)
}
