package warmfile

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
	"unsafe"

	"github.com/iidp/metasync/indexer"
)

// Error is why a file could not be read.
type Error struct {
	Reason string // one word, for metrics: truncated, checksum, format, corrupt
	Detail string
}

func (e *Error) Error() string { return "snapshot " + e.Reason + ": " + e.Detail }

func failure(reason, format string, args ...any) error {
	return &Error{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Decode checks a file and reads its resources' headers; the tables
// and objects are read by Table.Each and Resource.EachObject. The strings
// of the File alias data.
func Decode(data []byte) (*File, error) {
	min := len(magic) + 1 + 32 + 1 + 1 + 1 + 4
	if len(data) < min {
		return nil, failure("truncated", "%d bytes, less than the %d of an empty snapshot", len(data), min)
	}
	if string(data[:len(magic)]) != magic {
		return nil, failure("format", "not a metasync snapshot")
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	// The version first: a file of another version may checksum otherwise.
	d := decoder{b: body[len(magic):]}
	v := d.uint()
	if d.err != nil || v != Version && v != VersionClusters {
		return nil, failure("format", "format version %d, this metasync reads %d and %d", v, Version, VersionClusters)
	}
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, failure("checksum", "checksum %08x, the file says %08x: truncated or damaged", got, sum)
	}
	f := &File{Version: int(v)}
	copy(f.Config[:], d.bytes(32))
	clusters := map[string]bool{}
	if v == VersionClusters {
		nc := d.count(2)
		f.Clusters = make([]Cluster, 0, nc)
		for range nc {
			c := Cluster{Name: d.str(), Identity: d.str()}
			if d.err == nil && (c.Name == "" || clusters[c.Name]) {
				d.corrupt(fmt.Sprintf("cluster %q empty or twice", c.Name))
			}
			clusters[c.Name] = true
			f.Clusters = append(f.Clusters, c)
		}
	} else {
		f.Cluster = d.str()
	}
	f.WrittenAt = time.Unix(0, d.int())
	n := d.count(1)
	for range n {
		if d.err != nil {
			break
		}
		f.Resources = append(f.Resources, d.resource(v == VersionClusters, clusters))
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, failure("corrupt", "%d bytes after the last resource", len(d.b))
	}
	return f, nil
}

// resource reads one resource: its header, its tables, and its objects,
// counted (per part, of several clusters, each of the header's clusters).
func (d *decoder) resource(several bool, clusters map[string]bool) Resource {
	var r Resource
	r.Name = d.str()
	var prefixes []string
	if several {
		switch flags := d.uint(); {
		case flags&^resourceFlags5 != 0:
			d.corrupt(fmt.Sprintf("resource flags %#x", flags))
		default:
			r.TablesLeftOut = flags&flagNoTables != 0
		}
		np := d.count(3)
		r.Parts = make([]Part, 0, np)
		for range np {
			p := Part{Cluster: d.str(), ResourceVersion: d.str()}
			switch flags := d.uint(); {
			case flags&^flagRelist != 0:
				d.corrupt(fmt.Sprintf("part flags %#x", flags))
			default:
				p.Relist = flags&flagRelist != 0
			}
			if d.err == nil && (!clusters[p.Cluster] || slices.ContainsFunc(r.Parts, func(q Part) bool { return q.Cluster == p.Cluster })) {
				d.corrupt(fmt.Sprintf("resource %q: part of cluster %q, not in the header or twice", r.Name, p.Cluster))
			}
			r.Parts = append(r.Parts, p)
			prefixes = append(prefixes, p.Cluster+":")
		}
	} else {
		r.ResourceVersion = d.str()
		switch flags := d.uint(); {
		case flags&^flagRelist != 0:
			d.corrupt(fmt.Sprintf("resource flags %#x", flags))
		default:
			r.Relist = flags&flagRelist != 0
		}
	}
	nix := d.count(1)
	r.Indexes = make([]string, 0, nix)
	for range nix {
		r.Indexes = append(r.Indexes, d.str())
	}
	ns := d.count(1)
	r.Strings = make([]string, 0, ns)
	for range ns {
		r.Strings = append(r.Strings, d.str())
	}
	r.Tables = make([]Table, 0, nix)
	for range nix {
		if r.TablesLeftOut {
			break
		}
		r.Tables = append(r.Tables, d.table(r.Strings))
	}
	start := d.b
	r.MaxEntries, r.MaxBytes = make([]int, nix), make([]int, nix)
	for d.err == nil {
		if !d.more() {
			break
		}
		o := d.object(len(r.Indexes), nil, r.MaxEntries, r.MaxBytes)
		r.Objects++
		if several {
			if i := partOf(o.Key, prefixes); i >= 0 {
				r.Parts[i].Objects++
			} else if d.err == nil {
				d.corrupt(fmt.Sprintf("resource %q: object %q of no part", r.Name, o.Key))
			}
		}
	}
	if d.err == nil {
		r.objects = start[:len(start)-len(d.b)]
	}
	return r
}

// Each calls f with every key of the table, the numbers of its values in
// Resource.Strings and, when WithObjects, of its object keys. The slices
// are f's only until it returns.
func (t *Table) Each(f func(key string, values, objects []uint32)) {
	d := decoder{b: t.raw}
	d.b = d.b[1:] // the WithObjects flag
	var values, objects []uint32
	for d.more() {
		key := d.str()
		values = d.ids(values[:0], -1)
		if t.WithObjects {
			objects = d.ids(objects[:0], -1)
		}
		f(key, values, objects)
	}
}

// EachObject calls f with every object of the resource. The entries are
// f's only until it returns.
func (r *Resource) EachObject(f func(Object)) {
	d := decoder{b: r.objects}
	entries := make([][]indexer.Entry, len(r.Indexes))
	for d.more() {
		f(d.object(len(r.Indexes), entries, nil, nil))
	}
}

// decoder reads the body of a file; the first problem sticks and
// every read after it returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) corrupt(what string) {
	if d.err == nil {
		d.err = failure("corrupt", "%s", what)
	}
	d.b = nil
}

func (d *decoder) uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.corrupt("bad number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) int() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.corrupt("bad number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of items of at least size bytes each, refusing one
// that the bytes left cannot hold (so that a hostile count allocates
// nothing).
func (d *decoder) count(size int) int {
	v := d.uint()
	if v > uint64(len(d.b)/size) {
		d.corrupt(fmt.Sprintf("a count of %d with %d bytes left", v, len(d.b)))
		return 0
	}
	return int(v)
}

// more reads the marker before an item of a list: 1 for one more, 0 for
// the end.
func (d *decoder) more() bool {
	b := d.bytes(1)
	if len(b) == 0 {
		return false
	}
	switch b[0] {
	case 0:
		return false
	case 1:
		return true
	}
	d.corrupt(fmt.Sprintf("marker %d", b[0]))
	return false
}

func (d *decoder) bytes(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.corrupt(fmt.Sprintf("a length of %d with %d bytes left", n, len(d.b)))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) str() string { return d.strOf(d.uint()) }

func (d *decoder) strOf(n uint64) string {
	b := d.bytes(n)
	if len(b) == 0 {
		return ""
	}
	// The decoder's data is read-only to it: its strings share it.
	return unsafe.String(&b[0], len(b))
}

// ids reads a list of string numbers into buf; strings >= 0 checks each
// against the count of strings.
func (d *decoder) ids(buf []uint32, strings int) []uint32 {
	n := d.count(1)
	for range n {
		id := d.uint()
		if strings >= 0 && id >= uint64(strings) {
			d.corrupt(fmt.Sprintf("string %d of %d", id, strings))
			return buf
		}
		buf = append(buf, uint32(id))
	}
	return buf
}

// table checks one table and returns it: each key once, its values and
// object keys each once and in order, as the indexer holds them (a table
// that breaks this would answer duplicated or unsorted values).
func (d *decoder) table(strs []string) Table {
	start := d.b
	flag := d.bytes(1)
	if len(flag) == 0 || flag[0] > 1 {
		d.corrupt("table flag")
		return Table{}
	}
	t := Table{WithObjects: flag[0] == 1}
	var buf []uint32
	seen := map[string]struct{}{}
	for d.err == nil && d.more() {
		key := d.str()
		if _, dup := seen[key]; dup {
			d.corrupt(fmt.Sprintf("key %q twice in a table", key))
			break
		}
		seen[key] = struct{}{}
		buf = d.ids(buf[:0], len(strs))
		d.ascending(key, "values", buf, strs)
		if t.WithObjects {
			buf = d.ids(buf[:0], len(strs))
			d.ascending(key, "object keys", buf, strs)
		}
		t.Keys++
	}
	t.raw = start[:len(start)-len(d.b)]
	return t
}

// ascending checks that the strings that ids name are distinct and in
// order.
func (d *decoder) ascending(key, what string, ids []uint32, strs []string) {
	for i := 1; i < len(ids) && d.err == nil; i++ {
		if strs[ids[i-1]] >= strs[ids[i]] {
			d.corrupt(fmt.Sprintf("the %s of key %q are not distinct and sorted", what, key))
		}
	}
}

// object reads one object (after its marker); with entries nil it only
// checks it. maxEntries and maxBytes, when not nil, are raised to the
// object's count of entries and their bytes in each index.
func (d *decoder) object(indexes int, entries [][]indexer.Entry, maxEntries, maxBytes []int) Object {
	o := Object{Key: d.str()}
	if l := d.uint(); l > 0 {
		o.Payload, o.HasPayload = d.strOf(l-1), true
	}
	o.Meta.Version = d.str()
	if c := d.uint(); c < 1<<62 {
		o.Meta.Created = int64(c)
	} else {
		d.corrupt(fmt.Sprintf("object %q: creation time %d", o.Key, c))
	}
	for i := range indexes {
		ne := d.count(2)
		var es []indexer.Entry
		if entries != nil {
			es = entries[i][:0]
		}
		size := 0
		for range ne {
			k := d.str()
			v := o.Key
			if l := d.uint(); l != 0 {
				v = d.strOf(l - 1)
			}
			size += len(k) + len(v)
			if entries != nil {
				es = append(es, indexer.Entry{Key: k, Value: v})
			}
		}
		if maxEntries != nil {
			maxEntries[i] = max(maxEntries[i], ne)
			maxBytes[i] = max(maxBytes[i], size)
		}
		if entries != nil {
			entries[i] = es
		}
	}
	if entries != nil {
		o.Entries = entries
	}
	return o
}
