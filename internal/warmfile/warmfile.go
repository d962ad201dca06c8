// Package warmfile is the format of the warm-start file (the "snapshot
// file" of --snapshot-dir): for each resource entry, the resourceVersion
// its data is as of, its indexes as tables (what lookups read, loaded
// first) and its projected objects (what later writes need); for the
// config they were built for.
//
// A file is untrusted input: Decode checks its checksum, its format
// version and every length, count and reference against what is there, and
// returns an error, never a panic, for anything it cannot read. What it
// accepts, Table.Each and Resource.EachObject read without a failure.
//
// Layout (integers are unsigned varints unless said otherwise; a string is
// its length, then its bytes):
//
//	magic      "metasync-snapshot\n"
//	version    Version
//	config     32 bytes: the hash of the resource entries it was built for
//	cluster    string: the identity of the cluster the data came from
//	           ("" when it could not be read)
//	written    unix nanoseconds, as a varint
//	resources  count, then each:
//	  name, resourceVersion, flags (1: relist, see Resource.Relist),
//	  indexes (count, then names),
//	  strings (count, then each): the values and object keys of the tables,
//	  for each index, its table: 1 if it lists object keys, else 0; then
//	    for each key (each once): the byte 1, the key, its values (count,
//	    then each string's number, in the order of the strings they name,
//	    each once), and, if it lists them, its object keys (likewise);
//	    then the byte 0,
//	  objects, each: the byte 1, then
//	    key,
//	    payload: 0 for none, else length+1, then the bytes,
//	    provenance: resourceVersion (string), creation time (seconds
//	      since 1970, 0 unknown),
//	    for each index: entries (count, then each: key, then the value:
//	      0 for the object key, else length+1, then the bytes),
//	  then the byte 0
//	checksum   4 bytes, little endian: CRC-32C of everything before it
//
// A file of several clusters' data (VersionClusters) differs in its header
// and in each resource's:
//
//	magic, version, config as above
//	clusters   count, then each: name, identity ("" when unknown)
//	written    as above
//	resources  count, then each:
//	  name, flags (2: its tables are left out, see Resource.TablesLeftOut),
//	  parts (count, then each: cluster (a name of the header's), its
//	    resourceVersion, flags (1: relist)),
//	  indexes, strings, tables (none when left out), objects as above,
//	    each object's key beginning with "CLUSTER:" of one of the parts
//	checksum   as above
package warmfile

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"slices"
	"time"
	"unsafe"

	"github.com/iidp/metasync/indexer"
)

// Version is the format version of a file of one cluster's data
// (NewEncoder); VersionClusters that of a file of several clusters' data
// (NewClustersEncoder), each resource's objects in parts, one per
// cluster. Decode reads both.
const (
	Version         = 4
	VersionClusters = 5
)

const magic = "metasync-snapshot\n"

// The flags of a resource (of a part, in VersionClusters).
const (
	flagRelist     = 1
	flagNoTables   = 2 // VersionClusters: the resource's tables are left out
	resourceFlags5 = flagNoTables
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// File is a decoded file. Its strings are substrings of the data it
// was decoded from, which must not change while they are used: clone what
// is kept.
type File struct {
	// Version is Version or VersionClusters.
	Version int
	Config  [32]byte
	// Cluster names the cluster the data came from (the engine writes the
	// UID of its kube-system namespace); "" when it was not known, and in
	// a file of several clusters (see Clusters).
	Cluster string
	// Clusters, in a file of several clusters' data (VersionClusters):
	// each cluster of its resources' parts, with its identity; nil in a
	// file of one cluster.
	Clusters  []Cluster
	WrittenAt time.Time
	Resources []Resource
}

// Cluster is one cluster of a file of several clusters' data: its name
// in the config, and its identity as Cluster in a file of one ("" when
// it was not known).
type Cluster struct {
	Name, Identity string
}

// Part is one cluster's part of a resource, in a file of several
// clusters' data: the objects whose keys begin with "Cluster:", as of
// ResourceVersion, with Relist as Resource.Relist says it for a resource
// of one cluster.
type Part struct {
	Cluster         string
	ResourceVersion string
	Relist          bool
	// Objects is the number of the part's objects (set by Decode).
	Objects int
}

// Resource is one resource entry of a file.
type Resource struct {
	Name            string
	ResourceVersion string
	// Relist: the data is what the resource answered under an earlier
	// definition of its entry, which it had not listed since: it must be
	// listed, never resumed, from ResourceVersion.
	Relist  bool
	Indexes []string
	// Strings are the values and object keys that the tables name by
	// their number.
	Strings []string
	// Tables holds one table per index.
	Tables []Table
	// Objects is the number of objects (see EachObject).
	Objects int
	// MaxEntries and MaxBytes are, for each index, the most entries that
	// one object has in it and the most bytes of their keys and values.
	MaxEntries, MaxBytes []int
	// Parts, in a file of several clusters' data, are the resource's
	// parts (ResourceVersion and Relist are then unused); nil in a file
	// of one cluster. TablesLeftOut: the file has no tables for the
	// resource (Tables is empty): it is built from its objects.
	Parts         []Part
	TablesLeftOut bool
	objects       []byte // validated
}

// Table is one index of a file: each key with its values and, when
// WithObjects, the object keys behind it.
type Table struct {
	WithObjects bool
	Keys        int
	raw         []byte // validated
}

// Object is one projected object: its key, its payload (the projected
// fields) if it has one, and its entries for each index, in the order of
// Resource.Indexes (nil when it has none in any).
type Object struct {
	Key        string
	Payload    string
	HasPayload bool
	// Meta is the object's provenance: its resourceVersion and creation
	// time, for explain and unique indexes.
	Meta    indexer.Meta
	Entries [][]indexer.Entry
}

// Encoder writes one file: for each resource, Resource, then Table and
// the Keys of each index's table in order, then Object for each object;
// then Close. The first error sticks and is returned by Close.
type Encoder struct {
	dst  io.Writer
	w    *bufio.Writer
	crc  hash.Hash32
	err  error
	left int // resources still to come
	// clusters: a file of several clusters' data (NewClustersEncoder),
	// by name.
	clusters map[string]bool

	// The resource being written: open, its index and string counts, the
	// tables started, whether one is open and lists objects, whether its
	// objects have started.
	open               bool
	indexes, strings   int
	tables             int
	noTables           bool
	prefixes           []string // of the parts' objects ("CLUSTER:")
	inTable, tableObjs bool
	inObjs             bool
	buf                []byte
}

// NewEncoder writes the header of a file of the given number of
// resources to w.
func NewEncoder(w io.Writer, config [32]byte, cluster string, writtenAt time.Time, resources int) *Encoder {
	e := &Encoder{dst: w, crc: crc32.New(castagnoli), left: resources}
	e.w = bufio.NewWriterSize(io.MultiWriter(w, e.crc), 64<<10)
	e.buf = append(e.buf, magic...)
	e.buf = binary.AppendUvarint(e.buf, Version)
	e.buf = append(e.buf, config[:]...)
	e.str(cluster)
	e.buf = binary.AppendVarint(e.buf, writtenAt.UnixNano())
	e.buf = binary.AppendUvarint(e.buf, uint64(resources))
	e.flush()
	return e
}

// NewClustersEncoder writes the header of a file of several clusters'
// data (VersionClusters) of the given number of resources to w; each
// resource is started by ClusterResource, whose parts name clusters of
// clusters.
func NewClustersEncoder(w io.Writer, config [32]byte, clusters []Cluster, writtenAt time.Time, resources int) *Encoder {
	e := &Encoder{dst: w, crc: crc32.New(castagnoli), left: resources, clusters: map[string]bool{}}
	e.w = bufio.NewWriterSize(io.MultiWriter(w, e.crc), 64<<10)
	e.buf = append(e.buf, magic...)
	e.buf = binary.AppendUvarint(e.buf, VersionClusters)
	e.buf = append(e.buf, config[:]...)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(clusters)))
	for _, c := range clusters {
		if e.clusters[c.Name] || c.Name == "" {
			e.fail("cluster %q empty or twice", c.Name)
		}
		e.clusters[c.Name] = true
		e.str(c.Name)
		e.str(c.Identity)
	}
	e.buf = binary.AppendVarint(e.buf, writtenAt.UnixNano())
	e.buf = binary.AppendUvarint(e.buf, uint64(resources))
	e.flush()
	return e
}

func (e *Encoder) flush() {
	if e.err == nil {
		_, e.err = e.w.Write(e.buf)
	}
	e.buf = e.buf[:0]
}

func (e *Encoder) str(s string) {
	e.buf = binary.AppendUvarint(e.buf, uint64(len(s)))
	e.buf = append(e.buf, s...)
}

func (e *Encoder) fail(format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf("snapshot: "+format, args...)
	}
}

// Resource starts a resource whose tables name the strings by their
// number; relist marks data that must be listed, not resumed (see
// Resource.Relist).
func (e *Encoder) Resource(name, resourceVersion string, relist bool, indexes, strings []string) {
	if e.clusters != nil {
		e.fail("Resource in a file of several clusters: ClusterResource")
	}
	e.start()
	e.str(name)
	e.str(resourceVersion)
	var flags uint64
	if relist {
		flags |= flagRelist
	}
	e.buf = binary.AppendUvarint(e.buf, flags)
	e.head(indexes, strings)
}

// ClusterResource starts a resource of a file of several clusters' data:
// its parts, one per cluster, each a cluster of the header's at most
// once; every object written after it has a key that begins with the
// name of one of them and ":". With withTables false its tables are left
// out (no Table follows: the resource is built from its objects when it
// is read).
func (e *Encoder) ClusterResource(name string, parts []Part, withTables bool, indexes, strings []string) {
	if e.clusters == nil {
		e.fail("ClusterResource in a file of one cluster: Resource")
	}
	e.start()
	e.str(name)
	var flags uint64
	if !withTables {
		flags |= flagNoTables
	}
	e.buf = binary.AppendUvarint(e.buf, flags)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(parts)))
	seen := map[string]bool{}
	e.prefixes = e.prefixes[:0]
	for _, p := range parts {
		e.prefixes = append(e.prefixes, p.Cluster+":")
		if !e.clusters[p.Cluster] || seen[p.Cluster] {
			e.fail("part of cluster %q: not in the header, or twice", p.Cluster)
		}
		seen[p.Cluster] = true
		e.str(p.Cluster)
		e.str(p.ResourceVersion)
		var pf uint64
		if p.Relist {
			pf |= flagRelist
		}
		e.buf = binary.AppendUvarint(e.buf, pf)
	}
	e.noTables = !withTables
	e.head(indexes, strings)
}

// start begins a resource.
func (e *Encoder) start() {
	e.finish()
	if e.left == 0 {
		e.fail("more resources than announced")
	}
	e.left--
	e.open, e.tables, e.inObjs, e.noTables = true, 0, false, false
}

// head writes a resource's indexes and strings.
func (e *Encoder) head(indexes, strings []string) {
	e.indexes, e.strings = len(indexes), len(strings)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(indexes)))
	for _, ix := range indexes {
		e.str(ix)
	}
	e.buf = binary.AppendUvarint(e.buf, uint64(len(strings)))
	for _, s := range strings {
		e.str(s)
		if len(e.buf) > 32<<10 {
			e.flush()
		}
	}
	e.flush()
}

// endTable closes the current table, if one is open.
func (e *Encoder) endTable() {
	if e.inTable {
		e.buf = append(e.buf, 0)
		e.inTable = false
	}
}

// finish closes the current resource, if one is open.
func (e *Encoder) finish() {
	if !e.open {
		return
	}
	e.endTable()
	if e.tables != e.wantTables() {
		e.fail("%d tables for %d indexes", e.tables, e.indexes)
	}
	e.buf = append(e.buf, 0) // the end of its objects
	e.open = false
	e.flush()
}

// wantTables is the number of tables of the current resource.
func (e *Encoder) wantTables() int {
	if e.noTables {
		return 0
	}
	return e.indexes
}

// Table starts the table of the resource's next index.
func (e *Encoder) Table(withObjects bool) {
	if !e.open || e.inObjs || e.tables >= e.wantTables() {
		e.fail("table written out of turn")
	}
	e.endTable()
	e.tables++
	e.inTable, e.tableObjs = true, withObjects
	if withObjects {
		e.buf = append(e.buf, 1)
	} else {
		e.buf = append(e.buf, 0)
	}
}

// Key writes one key of the current table: the numbers of its values, and
// of its object keys when the table lists them.
func (e *Encoder) Key(key string, values, objects []uint32) {
	if !e.inTable {
		e.fail("key written outside a table")
	}
	e.buf = append(e.buf, 1)
	e.str(key)
	e.ids(values)
	if e.tableObjs {
		e.ids(objects)
	}
	if len(e.buf) > 32<<10 {
		e.flush()
	}
}

func (e *Encoder) ids(ids []uint32) {
	e.buf = binary.AppendUvarint(e.buf, uint64(len(ids)))
	for _, id := range ids {
		if int(id) >= e.strings {
			e.fail("string %d of %d", id, e.strings)
		}
		e.buf = binary.AppendUvarint(e.buf, uint64(id))
	}
}

// Object writes one object of the current resource, after its tables.
// entries may be shorter than the resource's indexes: the rest have none.
func (e *Encoder) Object(key string, payload string, hasPayload bool, meta indexer.Meta, entries [][]indexer.Entry) {
	e.endTable()
	if !e.open || e.tables != e.wantTables() || len(entries) > e.indexes {
		e.fail("object written before its resource's tables, or with more indexes than it")
	}
	if e.clusters != nil && partOf(key, e.prefixes) < 0 {
		e.fail("object %q of no part of the resource", key)
	}
	e.inObjs = true
	e.buf = append(e.buf, 1)
	e.str(key)
	if hasPayload {
		e.buf = binary.AppendUvarint(e.buf, uint64(len(payload))+1)
		e.buf = append(e.buf, payload...)
	} else {
		e.buf = append(e.buf, 0)
	}
	e.str(meta.Version)
	e.buf = binary.AppendUvarint(e.buf, uint64(max(meta.Created, 0)))
	for i := range e.indexes {
		var es []indexer.Entry
		if i < len(entries) {
			es = entries[i]
		}
		e.buf = binary.AppendUvarint(e.buf, uint64(len(es)))
		for _, en := range es {
			e.str(en.Key)
			if en.Value == key {
				e.buf = append(e.buf, 0)
			} else {
				e.buf = binary.AppendUvarint(e.buf, uint64(len(en.Value))+1)
				e.buf = append(e.buf, en.Value...)
			}
		}
	}
	if len(e.buf) > 32<<10 {
		e.flush()
	}
}

// Close writes the checksum and flushes. It reports the first error of
// the encoder, or of a file whose resources were fewer than announced.
func (e *Encoder) Close() error {
	e.finish()
	e.flush()
	if e.left != 0 {
		e.fail("fewer resources written than announced")
	}
	if e.err != nil {
		return e.err
	}
	if err := e.w.Flush(); err != nil {
		return err
	}
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], e.crc.Sum32())
	_, err := e.dst.Write(sum[:])
	return err
}

// partOf returns the index of the prefix that key begins with, or -1.
func partOf(key string, prefixes []string) int {
	for i, p := range prefixes {
		if len(key) >= len(p) && key[:len(p)] == p {
			return i
		}
	}
	return -1
}

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
		var r Resource
		r.Name = d.str()
		var prefixes []string
		if v == VersionClusters {
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
			if v == VersionClusters {
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
		f.Resources = append(f.Resources, r)
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, failure("corrupt", "%d bytes after the last resource", len(d.b))
	}
	return f, nil
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
