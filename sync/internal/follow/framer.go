package follow

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
type JSONFramer struct{}

func (JSONFramer) NewFrameReader(r io.ReadCloser) io.ReadCloser {
	return &frameReader{r: r, buf: make([]byte, 0, 32<<10)}
}

func (JSONFramer) NewFrameWriter(io.Writer) io.Writer {
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
	var sc frameScanner
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

var ErrNotObject = errors.New("watch stream: a frame is not a JSON object")

// frameScanner finds the end of one JSON object of a watch stream: it
// skips the blanks before the object, then leaves the counting of
// brackets to a bracketScanner. It is resumable: scan takes the same
// bytes again, longer.
type frameScanner struct {
	BracketScanner
	start, pos int  // the object's first byte; the next byte to scan
	started    bool // the object's '{' was seen
	err        error
}

// scan continues over b and reports whether the object is complete, in
// b[start:pos].
func (sc *frameScanner) scan(b []byte) bool {
	if !sc.started {
		for ; sc.pos < len(b) && isSpace(b[sc.pos]); sc.pos++ {
		}
		if sc.pos == len(b) {
			return false
		}
		if b[sc.pos] != '{' {
			sc.err = ErrNotObject
			return false
		}
		sc.started, sc.start, sc.Depth = true, sc.pos, 1
		sc.pos++
	}
	// With the object's '{' open, the only byte at depth 0 is the
	// bracket that closes it.
	sc.pos = sc.BracketScanner.Scan(b, sc.pos, 0)
	if sc.pos == len(b) {
		return false
	}
	sc.pos++
	return true
}

// BracketScanner follows the nesting of JSON text, as the framer and
// streamList both need it: it counts the brackets and braces open, and
// skips the strings, escapes included, so that a bracket or quote inside
// a string counts for nothing. It does not validate: its callers need the
// structure, and leave the checking to gjson. It is resumable: a scan that
// ends in the middle of a string or an escape continues where it stopped
// when more bytes arrive, the same bytes at the same offsets.
type BracketScanner struct {
	Depth    int  // brackets and braces open
	InString bool // inside a string
	Escaped  bool // the previous byte was a backslash in a string
}

// Scan advances over b from index i and stops at the next byte that
// shapes the structure at depth limit or less, returning its index, or
// len(b) if there is none. Those bytes are a quote that opens or closes a
// string, a comma, a bracket or brace that opens with depth limit or less
// before it, and one that closes with depth limit or less after it. The
// state is then that after the byte (depth is inside an opening bracket,
// outside a closing one), and the caller resumes at the index plus one.
// Unbalanced closers make depth negative; nothing here checks. Bytes
// deeper than limit are skipped without stopping, which keeps the scan
// fast: a caller asks only for the depths it reads.
func (s *BracketScanner) Scan(b []byte, i, limit int) int {
	depth, inString, escaped := s.Depth, s.InString, s.Escaped
loop:
	for ; i < len(b); i++ {
		c := b[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
				if depth <= limit {
					break loop
				}
			}
			continue
		}
		switch c {
		case '"':
			inString = true
			if depth <= limit {
				break loop
			}
		case '{', '[':
			depth++
			if depth <= limit+1 {
				break loop
			}
		case '}', ']':
			depth--
			if depth <= limit {
				break loop
			}
		case ',':
			if depth <= limit {
				break loop
			}
		}
	}
	s.Depth, s.InString, s.Escaped = depth, inString, escaped
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func (f *frameReader) Close() error { return f.r.Close() }
