package sync

import (
	"errors"
	"fmt"
	"io"
)

// jsonFramer splits a watch stream into its JSON objects, one per Read,
// as apimachinery's JSON framer does, but by counting brackets outside
// strings instead of running encoding/json's scanner over every byte: the
// framing was a third of the CPU an engine spent on a watch event. The
// frames are not validated here; the event codec reads them with gjson,
// and the object inside is checked with gjson.Valid before it is used.
type jsonFramer struct{}

func (jsonFramer) NewFrameReader(r io.ReadCloser) io.ReadCloser {
	return &frameReader{r: r, buf: make([]byte, 0, 32<<10)}
}

func (jsonFramer) NewFrameWriter(io.Writer) io.Writer {
	panic("metasync only reads")
}

// frameReader returns one JSON object of the stream per Read. A frame
// larger than the caller's buffer is returned in pieces, the first ones
// with io.ErrShortBuffer, as the streaming decoder expects.
type frameReader struct {
	r   io.ReadCloser
	buf []byte // bytes read from r: buf[off:] is not yet returned
	off int
	// rest is what remains of a frame that did not fit the caller's buffer.
	rest []byte
	err  error // from r, returned once buf holds no complete frame
}

// maxFrame bounds a frame: a watch event is at most an object of a few
// megabytes (etcd's request limit), far below this.
const maxFrame = 64 << 20

func (f *frameReader) Read(data []byte) (int, error) {
	if len(f.rest) > 0 {
		n := copy(data, f.rest)
		f.rest = f.rest[n:]
		if len(f.rest) > 0 {
			return n, io.ErrShortBuffer
		}
		return n, nil
	}
	start, end, err := f.next()
	if err != nil {
		return 0, err
	}
	frame := f.buf[start:end]
	f.off = end
	n := copy(data, frame)
	if n < len(frame) {
		// buf is reused by the next frame: keep a copy of the rest.
		f.rest = append([]byte(nil), frame[n:]...)
		return n, io.ErrShortBuffer
	}
	return n, nil
}

// next returns the bounds in buf of the next complete frame, reading
// as much as it needs. The scan of a partial frame resumes where it
// stopped when more bytes arrive.
func (f *frameReader) next() (int, int, error) {
	var sc scanner
	for {
		if sc.scan(f.buf[f.off:]) {
			return f.off + sc.start, f.off + sc.pos, nil
		}
		if sc.err != nil {
			return 0, 0, sc.err
		}
		if f.err != nil {
			if sc.started && f.err == io.EOF {
				return 0, 0, io.ErrUnexpectedEOF
			}
			return 0, 0, f.err
		}
		if len(f.buf)-f.off > maxFrame {
			return 0, 0, fmt.Errorf("watch event larger than %d bytes", maxFrame)
		}
		// Move the partial frame to the front, grow if it fills buf,
		// and read more.
		if f.off > 0 {
			n := copy(f.buf, f.buf[f.off:])
			f.buf, f.off = f.buf[:n], 0
		}
		if len(f.buf) == cap(f.buf) {
			f.buf = append(f.buf, make([]byte, cap(f.buf))...)[:len(f.buf)]
		}
		n, err := f.r.Read(f.buf[len(f.buf):cap(f.buf)])
		f.buf = f.buf[:len(f.buf)+n]
		if err != nil {
			f.err = err
		}
	}
}

var errNotObject = errors.New("watch stream: a frame is not a JSON object")

// scanner finds the end of one JSON object by counting brackets outside
// strings. It is resumable: scan takes the same bytes again, longer.
type scanner struct {
	start, pos int  // the object's first byte; the next byte to scan
	depth      int  // brackets open
	started    bool // the object's '{' was seen
	inString   bool
	escaped    bool // the previous byte was a backslash in a string
	err        error
}

// scan continues over b and reports whether the object is complete, in
// b[start:pos].
func (sc *scanner) scan(b []byte) bool {
	for ; sc.pos < len(b); sc.pos++ {
		c := b[sc.pos]
		switch {
		case !sc.started:
			if isSpace(c) {
				continue
			}
			if c != '{' {
				sc.err = errNotObject
				return false
			}
			sc.started, sc.start, sc.depth = true, sc.pos, 1
		case sc.inString:
			switch {
			case sc.escaped:
				sc.escaped = false
			case c == '\\':
				sc.escaped = true
			case c == '"':
				sc.inString = false
			}
		case c == '"':
			sc.inString = true
		case c == '{' || c == '[':
			sc.depth++
		case c == '}' || c == ']':
			sc.depth--
			if sc.depth == 0 {
				sc.pos++
				return true
			}
		}
	}
	return false
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func (f *frameReader) Close() error { return f.r.Close() }
