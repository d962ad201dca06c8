package warmfile

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"time"

	"github.com/iidp/metasync/indexer"
)

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
