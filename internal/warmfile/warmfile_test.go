package warmfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/iidp/metasync/indexer"
)

// plain is a snapshot's content in plain Go values, to compare.
type plain struct {
	Config    [32]byte
	WrittenAt int64
	Clusters  []Cluster // a file of several clusters' data
	Resources []plainResource
}

type plainResource struct {
	Name, RV      string
	Parts         []Part
	TablesLeftOut bool
	Indexes       []string
	Strings       []string
	Tables        []plainTable
	Objects       []Object
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
	var e *Encoder
	if p.Clusters != nil {
		e = NewClustersEncoder(&buf, p.Config, p.Clusters, time.Unix(0, p.WrittenAt), len(p.Resources))
	} else {
		e = NewEncoder(&buf, p.Config, "cluster-uid", time.Unix(0, p.WrittenAt), len(p.Resources))
	}
	for _, r := range p.Resources {
		if p.Clusters != nil {
			e.ClusterResource(r.Name, r.Parts, !r.TablesLeftOut, r.Indexes, r.Strings)
		} else {
			e.Resource(r.Name, r.RV, false, r.Indexes, r.Strings)
		}
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
	p := plain{Config: f.Config, WrittenAt: f.WrittenAt.UnixNano(), Clusters: f.Clusters}
	for _, r := range f.Resources {
		pr := plainResource{Name: r.Name, RV: r.ResourceVersion, Parts: r.Parts, TablesLeftOut: r.TablesLeftOut,
			Indexes: r.Indexes, Strings: r.Strings, Tables: []plainTable{}, Objects: []Object{}}
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
	otherVersion[len(magic)] = VersionClusters + 1
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
	f.Add(encode(f, clustersSample()))
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

// clustersSample is a file of two clusters' data: a resource with both
// parts and its tables, one with east's part alone and its tables left
// out.
func clustersSample() plain {
	return plain{
		Config:    [32]byte{4, 5, 6},
		WrittenAt: 1764547200123456789,
		Clusters:  []Cluster{{Name: "east", Identity: "uid-east"}, {Name: "west"}},
		Resources: []plainResource{
			{Name: "appmodels", Parts: []Part{{Cluster: "east", ResourceVersion: "4711", Objects: 1}, {Cluster: "west", ResourceVersion: "12", Relist: true, Objects: 2}},
				Indexes: []string{"model-to-app"}, Strings: []string{"east:default/a", "west:default/a", "west:default/b"},
				Tables: []plainTable{{WithObjects: true, Keys: []plainKey{{"m1", []uint32{0, 1}, []uint32{0, 1}}, {"m2", []uint32{2}, []uint32{2}}}}},
				Objects: []Object{
					{Key: "east:default/a", Meta: indexer.Meta{Version: "4700"}, Entries: [][]indexer.Entry{{{Key: "m1", Value: "east:default/a"}}}},
					{Key: "west:default/a", Meta: indexer.Meta{Version: "10"}, Entries: [][]indexer.Entry{{{Key: "m1", Value: "west:default/a"}}}},
					{Key: "west:default/b", Meta: indexer.Meta{Version: "11"}, Entries: [][]indexer.Entry{{{Key: "m2", Value: "west:default/b"}}}},
				}},
			{Name: "services", Parts: []Part{{Cluster: "east", ResourceVersion: "4711", Objects: 1}}, TablesLeftOut: true,
				Indexes: []string{"x"}, Strings: []string{}, Tables: []plainTable{},
				Objects: []Object{{Key: "east:ns/svc", Payload: "{}", HasPayload: true, Entries: [][]indexer.Entry{{{Key: "k", Value: "v"}}}}}},
		},
	}
}

func TestClustersRoundTrip(t *testing.T) {
	want := clustersSample()
	data := encode(t, want)
	if v, _ := binary.Uvarint(data[len(magic):]); v != VersionClusters {
		t.Fatalf("version %d, want %d", v, VersionClusters)
	}
	f, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != VersionClusters || f.Cluster != "" {
		t.Errorf("version %d, cluster %q", f.Version, f.Cluster)
	}
	if got := read(f); !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
}

// A file of one cluster written before files of several clusters existed
// (testdata/v4.snapshot: sample(), by the encoder of format version 4)
// reads as it did: same bytes from the encoder, same content, no parts.
func TestOneClusterFileOfVersion4(t *testing.T) {
	old, err := os.ReadFile("testdata/v4.snapshot")
	if err != nil {
		t.Fatal(err)
	}
	if got := encode(t, sample()); !bytes.Equal(got, old) {
		t.Errorf("the encoder of one cluster's data writes other bytes than format version 4's")
	}
	f, err := Decode(old)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != Version || f.Cluster != "cluster-uid" || f.Clusters != nil {
		t.Errorf("version %d, cluster %q, clusters %v", f.Version, f.Cluster, f.Clusters)
	}
	for _, r := range f.Resources {
		if r.Parts != nil || r.TablesLeftOut {
			t.Errorf("resource %s: parts %v, tables left out %v", r.Name, r.Parts, r.TablesLeftOut)
		}
	}
	if got := read(f); !reflect.DeepEqual(got, sample()) {
		t.Errorf("content:\n got %+v\nwant %+v", got, sample())
	}
}

func TestClustersFileRefusesWhatDoesNotFit(t *testing.T) {
	good := encode(t, clustersSample())
	// An object of a cluster that is no part of its resource.
	stray := withChecksum(bytes.Replace(good, []byte("east:ns/svc"), []byte("west:ns/svc"), 1))
	// A part of a cluster that the header does not name.
	unknown := withChecksum(bytes.Replace(good, []byte("\x04west\x00"), []byte("\x04wext\x00"), 1))
	for name, data := range map[string][]byte{"stray object": stray, "unknown cluster": unknown} {
		if bytes.Equal(data, withChecksum(good)) {
			t.Fatalf("%s: nothing replaced", name)
		}
		_, err := Decode(data)
		var se *Error
		if !errors.As(err, &se) || se.Reason != "corrupt" {
			t.Errorf("%s: %v, want a corrupt error", name, err)
		}
	}
	for name, write := range map[string]func(e *Encoder){
		"object of no part": func(e *Encoder) {
			e.ClusterResource("a", []Part{{Cluster: "east"}}, false, nil, nil)
			e.Object("west:k", "", false, indexer.Meta{}, nil)
		},
		"part of an unknown cluster": func(e *Encoder) { e.ClusterResource("a", []Part{{Cluster: "north"}}, false, nil, nil) },
		"part twice": func(e *Encoder) {
			e.ClusterResource("a", []Part{{Cluster: "east"}, {Cluster: "east"}}, false, nil, nil)
		},
		"one cluster's resource": func(e *Encoder) { e.Resource("a", "1", false, nil, nil) },
		"tables left out, then written": func(e *Encoder) {
			e.ClusterResource("a", []Part{{Cluster: "east"}}, false, []string{"i"}, nil)
			e.Table(false)
		},
	} {
		var buf bytes.Buffer
		e := NewClustersEncoder(&buf, [32]byte{}, []Cluster{{Name: "east"}, {Name: "west"}}, time.Now(), 1)
		write(e)
		if err := e.Close(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
