package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"
	"time"

	"github.com/iidp/metasync/indexer"
)

func sample() *File {
	return &File{
		Config:    [32]byte{1, 2, 3},
		WrittenAt: time.Unix(0, 1764547200123456789),
		Resources: []Resource{
			{Name: "appmodels", ResourceVersion: "4711", Indexes: []string{"model-to-app", "type"}, Objects: []Object{
				{Key: "default/base", Entries: [][]indexer.Entry{{{Key: "m1", Value: "default/base"}, {Key: "m2", Value: "default/base"}}, {{Key: "svc", Value: "x"}}}},
				{Key: "default/iiot", Payload: `{"version":"1.2"}`, HasPayload: true, Entries: [][]indexer.Entry{nil, {{Key: "", Value: ""}}}},
				{Key: "default/empty", Payload: "", HasPayload: true, Entries: [][]indexer.Entry{nil, nil}},
			}},
			{Name: "slices", ResourceVersion: "", Indexes: nil, Objects: []Object{{Key: "a", Entries: [][]indexer.Entry{}}}},
			{Name: "none", ResourceVersion: "9", Indexes: []string{"x"}},
		},
	}
}

func encode(t testing.TB, f *File) []byte {
	var buf bytes.Buffer
	e := NewEncoder(&buf, f.Config, f.WrittenAt, len(f.Resources))
	for _, r := range f.Resources {
		e.Resource(r.Name, r.ResourceVersion, r.Indexes)
		for _, o := range r.Objects {
			e.Object(o.Key, o.Payload, o.HasPayload, o.Entries)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	want := sample()
	got, err := Decode(encode(t, want))
	if err != nil {
		t.Fatal(err)
	}
	// Decode gives every index its slot; an object written with fewer has none.
	want.Resources[1].Indexes = []string{}
	want.Resources[0].Objects[2].Entries = nil // none in any index
	want.Resources[1].Objects[0].Entries = nil
	want.Resources[2].Objects = []Object{}
	if !got.WrittenAt.Equal(want.WrittenAt) {
		t.Errorf("written at %v, want %v", got.WrittenAt, want.WrittenAt)
	}
	got.WrittenAt = want.WrittenAt
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
}

func TestDamagedFilesAreRefused(t *testing.T) {
	good := encode(t, sample())
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x10
	otherVersion := bytes.Clone(good)
	otherVersion[len(magic)] = Version + 1
	for name, c := range map[string]struct {
		data   []byte
		reason string
	}{
		"empty":          {nil, "truncated"},
		"truncated":      {good[:len(good)-7], "checksum"},
		"header only":    {good[:len(magic)+3], "truncated"},
		"bit flipped":    {flipped, "checksum"},
		"other version":  {otherVersion, "format"},
		"not a snapshot": {append([]byte("apiVersion: v1\nkind: ConfigMap\n"), make([]byte, 64)...), "format"},
	} {
		_, err := Decode(c.data)
		var se *Error
		if !errors.As(err, &se) || se.Reason != c.reason {
			t.Errorf("%s: %v, want a %q error", name, err, c.reason)
		}
	}
}

func TestEncoderChecksItsCalls(t *testing.T) {
	var buf bytes.Buffer
	e := NewEncoder(&buf, [32]byte{}, time.Now(), 2)
	e.Resource("a", "1", []string{"i"})
	e.Object("k", "", false, nil)
	if err := e.Close(); err == nil {
		t.Error("a snapshot with fewer resources than announced closed without an error")
	}
	e = NewEncoder(&buf, [32]byte{}, time.Now(), 1)
	e.Resource("a", "1", []string{"i"})
	e.Object("k", "", false, [][]indexer.Entry{nil, nil})
	if err := e.Close(); err == nil {
		t.Error("an object with more indexes than its resource was written without an error")
	}
}

func FuzzDecode(f *testing.F) {
	good := encode(f, sample())
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(magic))
	f.Fuzz(func(t *testing.T, data []byte) {
		// As it comes (mostly refused by the checksum), and with a
		// checksum that fits, so that the parser sees the bytes.
		_, _ = Decode(data)
		if len(data) >= 4 {
			data = bytes.Clone(data)
			binary.LittleEndian.PutUint32(data[len(data)-4:], crc32.Checksum(data[:len(data)-4], castagnoli))
		}
		file, err := Decode(data)
		if err != nil {
			return
		}
		// What decodes encodes back to the same bytes, but for the
		// shortcuts of the writer (a value equal to the key).
		again, err := Decode(encode(t, file))
		if err != nil {
			t.Fatalf("re-encoded snapshot does not decode: %v", err)
		}
		if len(again.Resources) != len(file.Resources) {
			t.Fatalf("%d resources, then %d", len(file.Resources), len(again.Resources))
		}
	})
}
