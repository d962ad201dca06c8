package sync

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

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
		got, err := readFrames(jsonFramer{}.NewFrameReader(io.NopCloser(iotest.OneByteReader(bytes.NewReader(stream)))), n)
		whole, _ := readFrames(jsonFramer{}.NewFrameReader(io.NopCloser(bytes.NewReader(stream))), 1<<20)
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
		{`{"a":1} 42`, 1, errNotObject},
	} {
		frames, err := readFrames(jsonFramer{}.NewFrameReader(io.NopCloser(bytes.NewReader([]byte(tc.stream)))), 4)
		if len(frames) != tc.frames || !errors.Is(err, tc.err) {
			t.Errorf("%q: %d frames, %v; want %d, %v", tc.stream, len(frames), err, tc.frames, tc.err)
		}
	}
}
