package warmfile

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

// plain is a snapshot's content in plain Go values, to compare.
type plain struct {
	Config    [32]byte
	WrittenAt int64
	Resources []plainResource
}

type plainResource struct {
	Name, RV string
	Indexes  []string
	Strings  []string
	Tables   []plainTable
	Objects  []Object
}

type plainTable struct {
	WithObjects bool
	Keys        []plainKey
}

type plainKey struct {
	Key             string
	Values, Objects []uint32
}

func sample() plain {
	return plain{
		Config:    [32]byte{1, 2, 3},
		WrittenAt: 1764547200123456789,
		Resources: []plainResource{
			{Name: "appmodels", RV: "4711", Indexes: []string{"model-to-app", "type"}, Strings: []string{"default/base", "x", ""},
				Tables: []plainTable{
					{WithObjects: true, Keys: []plainKey{{"m1", []uint32{0}, []uint32{0}}, {"m2", []uint32{0}, []uint32{0}}}},
					{Keys: []plainKey{{"svc", []uint32{1}, nil}, {"", []uint32{2}, nil}}},
				},
				Objects: []Object{
					{Key: "default/base", Meta: indexer.Meta{Version: "4127", Created: 1764547200}, Entries: [][]indexer.Entry{{{Key: "m1", Value: "default/base"}, {Key: "m2", Value: "default/base"}}, {{Key: "svc", Value: "x"}}}},
					{Key: "default/iiot", Payload: `{"version":"1.2"}`, HasPayload: true, Meta: indexer.Meta{Version: "v-not-a-number"}, Entries: [][]indexer.Entry{{}, {{Key: "", Value: ""}}}},
					{Key: "default/empty", Payload: "", HasPayload: true, Entries: [][]indexer.Entry{{}, {}}},
				}},
			{Name: "none", RV: "9", Indexes: []string{}, Strings: []string{}, Tables: []plainTable{}, Objects: []Object{{Key: "a", Entries: [][]indexer.Entry{}}}},
			{Name: "empty", RV: "10", Indexes: []string{"x"}, Strings: []string{}, Tables: []plainTable{{}}, Objects: []Object{}},
		},
	}
}

func encode(t testing.TB, p plain) []byte {
	var buf bytes.Buffer
	e := NewEncoder(&buf, p.Config, "cluster-uid", time.Unix(0, p.WrittenAt), len(p.Resources))
	for _, r := range p.Resources {
		e.Resource(r.Name, r.RV, false, r.Indexes, r.Strings)
		for _, tb := range r.Tables {
			e.Table(tb.WithObjects)
			for _, k := range tb.Keys {
				e.Key(k.Key, k.Values, k.Objects)
			}
		}
		for _, o := range r.Objects {
			e.Object(o.Key, o.Payload, o.HasPayload, o.Meta, o.Entries)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// read gives a decoded File back in plain values.
func read(f *File) plain {
	p := plain{Config: f.Config, WrittenAt: f.WrittenAt.UnixNano()}
	for _, r := range f.Resources {
		pr := plainResource{Name: r.Name, RV: r.ResourceVersion, Indexes: r.Indexes, Strings: r.Strings, Tables: []plainTable{}, Objects: []Object{}}
		for _, tb := range r.Tables {
			pt := plainTable{WithObjects: tb.WithObjects}
			tb.Each(func(key string, values, objects []uint32) {
				pk := plainKey{Key: key, Values: append([]uint32{}, values...)}
				if tb.WithObjects {
					pk.Objects = append([]uint32{}, objects...)
				}
				pt.Keys = append(pt.Keys, pk)
			})
			if len(pt.Keys) != tb.Keys {
				panic("key count")
			}
			pr.Tables = append(pr.Tables, pt)
		}
		r.EachObject(func(o Object) {
			c := o
			c.Entries = make([][]indexer.Entry, len(o.Entries))
			for i, es := range o.Entries {
				c.Entries[i] = append([]indexer.Entry{}, es...)
			}
			pr.Objects = append(pr.Objects, c)
		})
		if len(pr.Objects) != r.Objects {
			panic("object count")
		}
		p.Resources = append(p.Resources, pr)
	}
	return p
}

func TestRoundTrip(t *testing.T) {
	want := sample()
	f, err := Decode(encode(t, want))
	if err != nil {
		t.Fatal(err)
	}
	if got := read(f); !reflect.DeepEqual(got, want) {
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
	for name, write := range map[string]func(e *Encoder){
		"fewer resources": func(e *Encoder) { e.Resource("a", "1", false, nil, nil) },
		"object before the tables": func(e *Encoder) {
			e.Resource("a", "1", false, []string{"i"}, nil)
			e.Object("k", "", false, indexer.Meta{}, nil)
		},
		"a string that is not there": func(e *Encoder) {
			e.Resource("a", "1", false, []string{"i"}, []string{"s"})
			e.Table(false)
			e.Key("k", []uint32{1}, nil)
		},
		"too many tables": func(e *Encoder) {
			e.Resource("a", "1", false, nil, nil)
			e.Table(false)
		},
	} {
		var buf bytes.Buffer
		e := NewEncoder(&buf, [32]byte{}, "", time.Now(), 2)
		write(e)
		if name != "fewer resources" {
			e.Resource("b", "1", false, nil, nil)
		}
		if err := e.Close(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// withChecksum returns data with a checksum that fits, so that the parser
// sees the bytes.
func withChecksum(data []byte) []byte {
	if len(data) < 4 {
		return data
	}
	data = bytes.Clone(data)
	binary.LittleEndian.PutUint32(data[len(data)-4:], crc32.Checksum(data[:len(data)-4], castagnoli))
	return data
}

func FuzzDecode(f *testing.F) {
	good := encode(f, sample())
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(magic))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = Decode(data) // as it comes: mostly refused by the checksum
		file, err := Decode(withChecksum(data))
		if err != nil {
			return
		}
		// What Decode accepts, the readers read without a failure, and it
		// encodes back to what decodes the same.
		p := read(file)
		again, err := Decode(encode(t, p))
		if err != nil {
			t.Fatalf("re-encoded snapshot does not decode: %v", err)
		}
		if q := read(again); !reflect.DeepEqual(p, q) {
			t.Fatalf("re-encoded snapshot differs:\n%+v\n%+v", p, q)
		}
	})
}
