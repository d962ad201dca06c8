// Package snapshot is the file format of metasync's warm start: the
// projected objects of each resource entry and the resourceVersion they
// are as of, for the config they were built for.
//
// A file is untrusted input: Decode checks its checksum, format version
// and every length against what is left, and returns an error, never a
// panic, for anything it cannot read.
//
// Layout (integers are unsigned varints unless said otherwise; a string is
// its length, then its bytes):
//
//	magic      "metasync-snapshot\n"
//	version    Version
//	config     32 bytes: the hash of the resource entries it was built for
//	written    unix nanoseconds, as a varint
//	resources  count, then each:
//	  name, resourceVersion, indexes (count, then names),
//	  objects, each: the byte 1, then
//	    key,
//	    payload: 0 for none, else length+1, then the bytes,
//	    for each index: entries (count, then each: key, then the value:
//	      0 for the object key, else length+1, then the bytes),
//	  then the byte 0
//	checksum   4 bytes, little endian: CRC-32C of everything before it
package snapshot

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"time"

	"github.com/iidp/metasync/indexer"
)

// Version is the format version this package writes and reads.
const Version = 1

const magic = "metasync-snapshot\n"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// File is a decoded snapshot. Its strings are substrings of the data it
// was decoded from: clone what is kept.
type File struct {
	Config    [32]byte
	WrittenAt time.Time
	Resources []Resource
}

// Resource is one resource entry of a snapshot.
type Resource struct {
	Name            string
	ResourceVersion string
	Indexes         []string
	Objects         []Object
}

// Object is one projected object: its key, its payload (the projected
// fields) if it has one, and its entries for each index, in the order of
// Resource.Indexes (nil when it has none in any).
type Object struct {
	Key        string
	Payload    string
	HasPayload bool
	Entries    [][]indexer.Entry
}

// Encoder writes one snapshot. Call Resource, then Object for each of its
// objects, for each resource; then Close. The first error sticks and is
// returned by Close.
type Encoder struct {
	dst     io.Writer
	w       *bufio.Writer
	crc     hash.Hash32
	err     error
	left    int  // resources still to come
	open    bool // a resource is being written
	indexes int  // indexes of the current resource
	buf     []byte
}

// NewEncoder writes the header of a snapshot of the given number of
// resources to w.
func NewEncoder(w io.Writer, config [32]byte, writtenAt time.Time, resources int) *Encoder {
	e := &Encoder{dst: w, crc: crc32.New(castagnoli), left: resources}
	e.w = bufio.NewWriterSize(io.MultiWriter(w, e.crc), 64<<10)
	e.buf = append(e.buf, magic...)
	e.buf = binary.AppendUvarint(e.buf, Version)
	e.buf = append(e.buf, config[:]...)
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

// Resource starts a resource; its objects follow.
func (e *Encoder) Resource(name, resourceVersion string, indexes []string) {
	if e.err == nil && e.left == 0 {
		e.err = errors.New("snapshot: more resources than announced")
	}
	e.end()
	e.left--
	e.open, e.indexes = true, len(indexes)
	e.str(name)
	e.str(resourceVersion)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(indexes)))
	for _, ix := range indexes {
		e.str(ix)
	}
	e.flush()
}

// end closes the current resource, if one is open.
func (e *Encoder) end() {
	if e.open {
		e.buf = append(e.buf, 0)
		e.open = false
	}
}

// Object writes one object of the current resource. entries may be shorter
// than the resource's indexes: the rest have none.
func (e *Encoder) Object(key string, payload string, hasPayload bool, entries [][]indexer.Entry) {
	if e.err == nil && (!e.open || len(entries) > e.indexes) {
		e.err = errors.New("snapshot: object written out of turn, or with more indexes than its resource")
	}
	e.buf = append(e.buf, 1)
	e.str(key)
	if hasPayload {
		e.buf = binary.AppendUvarint(e.buf, uint64(len(payload))+1)
		e.buf = append(e.buf, payload...)
	} else {
		e.buf = append(e.buf, 0)
	}
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
	e.flush()
}

// Close writes the checksum and flushes. It reports the first error of
// the encoder, or of a snapshot whose resources were fewer than announced.
func (e *Encoder) Close() error {
	e.end()
	e.flush()
	if e.err == nil && e.left != 0 {
		e.err = errors.New("snapshot: fewer resources written than announced")
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

// Error is why a snapshot could not be read.
type Error struct {
	Reason string // one word, for metrics: truncated, checksum, format, corrupt
	Detail string
}

func (e *Error) Error() string { return "snapshot " + e.Reason + ": " + e.Detail }

func fail(reason, format string, args ...any) error {
	return &Error{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Decode reads a snapshot. The strings of the File alias data.
func Decode(data []byte) (*File, error) {
	min := len(magic) + 1 + 32 + 1 + 1 + 4
	if len(data) < min {
		return nil, fail("truncated", "%d bytes, less than the %d of an empty snapshot", len(data), min)
	}
	if string(data[:len(magic)]) != magic {
		return nil, fail("format", "not a metasync snapshot")
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	// The version first: a file of another version may checksum otherwise.
	d := decoder{b: body[len(magic):]}
	if v := d.uint(); d.err != nil || v != Version {
		return nil, fail("format", "format version %d, this metasync reads %d", v, Version)
	}
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, fail("checksum", "checksum %08x, the file says %08x: truncated or damaged", got, sum)
	}
	f := &File{}
	copy(f.Config[:], d.bytes(32))
	f.WrittenAt = time.Unix(0, d.int())
	n := d.count(1)
	for range n {
		if d.err != nil {
			break
		}
		var r Resource
		r.Name = d.str()
		r.ResourceVersion = d.str()
		nix := d.count(1)
		r.Indexes = make([]string, 0, nix)
		for range nix {
			r.Indexes = append(r.Indexes, d.str())
		}
		r.Objects = []Object{}
		for d.err == nil {
			if more := d.bytes(1); len(more) == 0 || more[0] == 0 {
				break
			} else if more[0] != 1 {
				d.corrupt(fmt.Sprintf("object marker %d", more[0]))
				break
			}
			o := Object{Key: d.str()}
			if l := d.uint(); l > 0 {
				o.Payload, o.HasPayload = d.strOf(l-1), true
			}
			for i := range r.Indexes {
				ne := d.count(2)
				if ne == 0 {
					continue
				}
				if o.Entries == nil {
					// Only for an object with entries: an index count is
					// not bounded by the bytes of each object.
					o.Entries = make([][]indexer.Entry, len(r.Indexes))
				}
				es := make([]indexer.Entry, ne)
				for j := range es {
					es[j].Key = d.str()
					if l := d.uint(); l == 0 {
						es[j].Value = o.Key
					} else {
						es[j].Value = d.strOf(l - 1)
					}
				}
				o.Entries[i] = es
			}
			r.Objects = append(r.Objects, o)
		}
		f.Resources = append(f.Resources, r)
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fail("corrupt", "%d bytes after the last resource", len(d.b))
	}
	return f, nil
}

// decoder reads the body of a snapshot; the first problem sticks and
// every read after it returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) corrupt(what string) {
	if d.err == nil {
		d.err = fail("corrupt", "%s", what)
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
	return unsafeString(b)
}
