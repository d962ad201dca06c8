package sync

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
	"testing/iotest"

	"github.com/iidp/metasync/sync/internal/follow"

	"k8s.io/apimachinery/pkg/util/framer"
)

// readFrames reads frames through a Read buffer of size n, reassembling
// the pieces of frames that do not fit, until the first error.
func readFrames(r io.Reader, n int) ([]string, error) {
	var frames []string
	var cur []byte
	buf := make([]byte, n)
	for {
		k, err := r.Read(buf)
		cur = append(cur, buf[:k]...)
		if errors.Is(err, io.ErrShortBuffer) {
			continue
		}
		if err != nil {
			return frames, err
		}
		frames = append(frames, string(cur))
		cur = nil
	}
}

var frameSeeds = []string{
	`{"type":"ADDED","object":{"a":"}{][\"\\","b":[1,{"c":[]}],"d":"ü€𝄞"}}` + "\n" + `{"type":"DELETED","object":{}}`,
	`  {"x":{}}{"y":[]}` + "\r\n\t" + `{"z":"\\"}`,
	`{"a":"\u007d"}{`,
	`[1,2]`,
	`{"a":1}"s"`,
	`{"unterminated":"}`,
}

// FuzzFrames: on any stream, the frames before the first error are those
// of apimachinery's JSON framer, whatever the reads' sizes.
func FuzzFrames(f *testing.F) {
	for _, s := range frameSeeds {
		f.Add([]byte(s), uint8(7))
	}
	f.Fuzz(func(t *testing.T, stream []byte, size uint8) {
		n := int(size)%64 + 1
		want, _ := readFrames(framer.NewJSONFramedReader(io.NopCloser(bytes.NewReader(stream))), 1<<20)
		got, err := readFrames(follow.JSONFramer{}.NewFrameReader(io.NopCloser(iotest.OneByteReader(bytes.NewReader(stream)))), n)
		whole, _ := readFrames(follow.JSONFramer{}.NewFrameReader(io.NopCloser(bytes.NewReader(stream))), 1<<20)
		// apimachinery's framer also passes arrays and scalars, which no
		// watch stream holds and ours refuses: compare up to the first.
		for i, w := range want {
			if len(bytes.TrimSpace([]byte(w))) == 0 || bytes.TrimSpace([]byte(w))[0] != '{' {
				want = want[:i]
				break
			}
		}
		if len(got) < len(want) {
			t.Fatalf("got %d frames (then %v), want at least %d: %q vs %q", len(got), err, len(want), got, want)
		}
		for i := range want {
			if got[i] != want[i] || whole[i] != want[i] {
				t.Fatalf("frame %d = %q (read whole: %q), want %q", i, got[i], whole[i], want[i])
			}
		}
	})
}

func TestFramesEndCleanly(t *testing.T) {
	for _, tc := range []struct {
		stream string
		frames int
		err    error
	}{
		{"", 0, io.EOF},
		{"  \n", 0, io.EOF},
		{`{"a":1}` + "\n", 1, io.EOF},
		{`{"a":1}{"b":`, 1, io.ErrUnexpectedEOF},
		{`{"a":1} 42`, 1, follow.ErrNotObject},
	} {
		frames, err := readFrames(follow.JSONFramer{}.NewFrameReader(io.NopCloser(bytes.NewReader([]byte(tc.stream)))), 4)
		if len(frames) != tc.frames || !errors.Is(err, tc.err) {
			t.Errorf("%q: %d frames, %v; want %d, %v", tc.stream, len(frames), err, tc.frames, tc.err)
		}
	}
}

// BenchmarkFrames splits a watch stream of AppModel events into frames:
// the framer alone, without the decoding of the events.
func BenchmarkFrames(b *testing.B) {
	var stream bytes.Buffer
	for i := range 4096 {
		stream.WriteString(appModelEvent(i, 100+i))
	}
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(stream.Len()))
	b.ReportAllocs()
	for b.Loop() {
		fr := follow.JSONFramer{}.NewFrameReader(io.NopCloser(bytes.NewReader(stream.Bytes())))
		n := 0
		for {
			_, err := fr.Read(buf)
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != 4096 {
			b.Fatalf("%d frames", n)
		}
	}
}

// scanEvent is where a bracketScanner stopped, and its state there.
type scanEvent struct {
	at    int
	state follow.BracketScanner
}

// scanEvents scans b with a bracketScanner for the bytes at depth limit
// or less, as if b[:cut] had arrived first and the rest later, and ends
// with the state after the last byte.
func scanEvents(b []byte, cut, limit int) []scanEvent {
	var sc follow.BracketScanner
	var events []scanEvent
	i := 0
	for _, end := range []int{cut, len(b)} {
		for {
			if i = sc.Scan(b[:end], i, limit); i == end {
				break
			}
			events = append(events, scanEvent{i, sc})
			i++
		}
	}
	return append(events, scanEvent{len(b), sc})
}

// FuzzBracketScanner: the scanner stops at the bytes that a plain walk
// over every byte finds at the depth asked for, in the same state,
// whatever the split of the bytes between two scans.
func FuzzBracketScanner(f *testing.F) {
	for _, s := range frameSeeds {
		f.Add([]byte(s), uint8(5), int8(1))
	}
	f.Add([]byte(trickyList), uint8(200), int8(2))
	f.Fuzz(func(t *testing.T, b []byte, cut uint8, limit int8) {
		lim := int(limit) % 4
		var want []scanEvent
		var st follow.BracketScanner
		for i, c := range b {
			stop := false
			if st.InString {
				switch {
				case st.Escaped:
					st.Escaped = false
				case c == '\\':
					st.Escaped = true
				case c == '"':
					st.InString, stop = false, st.Depth <= lim
				}
			} else {
				switch c {
				case '"':
					st.InString, stop = true, st.Depth <= lim
				case '{', '[':
					st.Depth++
					stop = st.Depth <= lim+1
				case '}', ']':
					st.Depth--
					stop = st.Depth <= lim
				case ',':
					stop = st.Depth <= lim
				}
			}
			if stop {
				want = append(want, scanEvent{i, st})
			}
		}
		want = append(want, scanEvent{len(b), st})
		for _, k := range []int{0, int(cut) % (len(b) + 1), len(b)} {
			if got := scanEvents(b, k, lim); !slices.Equal(got, want) {
				t.Fatalf("split at %d, limit %d: %+v, want %+v", k, lim, got, want)
			}
		}
	})
}
