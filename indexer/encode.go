package indexer

import (
	"encoding/binary"
	"strconv"
	"strings"
	"unsafe"
)

// An object's encoding: what the writer keeps of an object's entries, in
// its record (see objectSet), so that an update or delete can withdraw
// exactly them.
//
// Keys are front-coded: an index's entries are sorted by key, and keys of
// one object often share a beginning ("iiot_data_query",
// "iiot_dataservice"), which a key after the first writes once. Values
// that repeat the object key, its name, or the previous value are marks.

// Marks of encode for a value that is not written out.
const (
	sameAsObjectKey  = 0 // the value is the object key
	sameAsPrevious   = 1 // the value is the previous entry's value
	sameAsObjectName = 2 // the value is the object key's part after its first '/'
	valueOffset      = 3 // otherwise: length + valueOffset, then the bytes
)

// objectName returns the object key's part after its first '/', or ""
// when it has none (a value equal to "" is written out, not marked).
func objectName(objectKey string) string {
	if i := strings.IndexByte(objectKey, '/'); i >= 0 {
		return objectKey[i+1:]
	}
	return ""
}

// sharedPrefix returns the length of the longest common prefix of a and b.
func sharedPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// encode returns the encoding of an object's normalized entries (see
// appendEncoding); a record holds it (see newRecord).
func encode(objectKey string, meta Meta, entries [][]Entry) string {
	return string(appendEncoding(nil, objectKey, encodeMeta(nil, meta), entries))
}

// appendEncoding appends to b an object's encoding: the provenance,
// then per index the number of entries, and per entry its key, as
// uvarint(len(suffix)<<1 | shared>0), then uvarint(shared) when shared is
// not 0, then the suffix, where shared is how many bytes the key begins
// with of the previous key's; then its value, as a mark or as
// uvarint(len+valueOffset) and the bytes.
func appendEncoding(b []byte, objectKey string, head []byte, entries [][]Entry) []byte {
	name := objectName(objectKey)
	b = append(b, head...)
	for _, es := range entries {
		b = binary.AppendUvarint(b, uint64(len(es)))
		prevKey, prev := "", ""
		for j, e := range es {
			shared := 0
			if j > 0 {
				shared = sharedPrefix(prevKey, e.Key)
			}
			if shared > 0 {
				b = binary.AppendUvarint(b, uint64(len(e.Key)-shared)<<1|1)
				b = binary.AppendUvarint(b, uint64(shared))
			} else {
				b = binary.AppendUvarint(b, uint64(len(e.Key))<<1)
			}
			b = append(b, e.Key[shared:]...)
			switch {
			case e.Value == objectKey:
				b = append(b, sameAsObjectKey)
			case j > 0 && e.Value == prev:
				b = append(b, sameAsPrevious)
			case name != "" && e.Value == name:
				b = append(b, sameAsObjectName)
			default:
				b = binary.AppendUvarint(b, uint64(len(e.Value))+valueOffset)
				b = append(b, e.Value...)
			}
			prevKey, prev = e.Key, e.Value
		}
	}
	return b
}

// encodeMeta appends an object's provenance to b: the creation time in
// seconds (0: unknown), then the version, as a number when it is one
// (uvarint(n<<1|1), a few bytes for a resourceVersion) and otherwise as
// its bytes (uvarint(len<<1), then the bytes).
func encodeMeta(b []byte, m Meta) []byte {
	created := uint64(0)
	if m.Created > 0 {
		created = uint64(m.Created)
	}
	b = binary.AppendUvarint(b, created)
	if n, ok := versionNumber(m.Version); ok {
		return binary.AppendUvarint(b, n<<1|1)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Version))<<1)
	return append(b, m.Version...)
}

// versionNumber reads a version that is a decimal number without leading
// zeros, below 2^62.
func versionNumber(v string) (uint64, bool) {
	if v == "" || len(v) > 18 || v[0] == '0' {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// uvarint reads one uvarint at the start of enc.
func uvarint(enc string) (uint64, string) {
	var v uint64
	for shift := 0; ; shift += 7 {
		c := enc[0]
		enc = enc[1:]
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, enc
		}
	}
}

// splitMeta splits an encoding into its provenance and its entries.
func splitMeta(enc string) (head, rest string) {
	_, rest = uvarint(enc)
	n, rest := uvarint(rest)
	if n&1 == 0 {
		rest = rest[n>>1:]
	}
	return enc[:len(enc)-len(rest)], rest
}

// decodeMeta reads the provenance of an encoding. A numeric version is
// formatted anew: a caller that keeps it owns it.
func decodeMeta(enc string) Meta {
	created, rest := uvarint(enc)
	n, rest := uvarint(rest)
	m := Meta{Created: int64(created)}
	if n&1 == 1 {
		m.Version = strconv.FormatUint(n>>1, 10)
	} else {
		m.Version = strings.Clone(rest[:n>>1])
	}
	return m
}

// decode unpacks what encode packed, for n indexes. The values it returns
// are substrings of enc (or objectKey), and so are the keys written whole;
// a key front-coded is rebuilt in memory of its own (see decodeIn).
func decode(enc, objectKey string, n int) [][]Entry {
	return decodeInto(make([][]Entry, n), enc, objectKey)
}

// decodeInto is decode into out (len(out) indexes), reusing the room of
// out's slices: what it returns is valid until the next call with out.
func decodeInto(out [][]Entry, enc, objectKey string) [][]Entry {
	var room []byte
	return decodeIn(out, enc, objectKey, &room)
}

// decodeIn is decodeInto with the room of the keys it rebuilds given: calls
// that share one append to it, for fewer allocations (a bulk build, a scan
// for claims and an explanation decode every object). A room is only
// appended to: a key once rebuilt never changes.
func decodeIn(out [][]Entry, enc, objectKey string, keys *[]byte) [][]Entry {
	_, enc = splitMeta(enc)
	name := objectName(objectKey)
	for i := range out {
		out[i], enc = decodeEntries(out[i], enc, objectKey, name, keys)
	}
	return out
}

// decodeEntries decodes the entries of one index, at the start of enc
// (past the provenance), into es's room, and returns them and the rest of
// enc. name is objectKey's name (objectName), keys the room of the keys
// it rebuilds (see decodeIn).
func decodeEntries(es []Entry, enc, objectKey, name string, keys *[]byte) ([]Entry, string) {
	if enc == "" {
		return es[:0], "" // none
	}
	next := func() int {
		v, rest := uvarint(enc)
		enc = rest
		return int(v)
	}
	// The room of the keys rebuilt: never written again where a key was
	// cut, so each key stays as it was when the room grows.
	room := *keys
	defer func() { *keys = room }()
	count := next()
	if es == nil || cap(es) < count {
		es = make([]Entry, count)
	}
	es = es[:count]
	for j := range count {
		l := next()
		shared := 0
		if l&1 == 1 {
			shared = next()
		}
		l >>= 1
		switch {
		case shared == 0:
			es[j].Key, enc = enc[:l], enc[l:]
		case l == 0 && shared == len(es[j-1].Key):
			es[j].Key = es[j-1].Key // the same key, with another value
		default:
			if cap(room)-len(room) < shared+l {
				// What the key needs, or twice the room before (up to
				// 32 KiB): a shared room grows in few steps.
				room = make([]byte, 0, max(shared+l, min(2*cap(room), 32<<10), 64))
			}
			at := len(room)
			room = append(room, es[j-1].Key[:shared]...)
			room = append(room, enc[:l]...)
			enc = enc[l:]
			es[j].Key = unsafe.String(&room[at], shared+l)
		}
		switch l := next(); l {
		case sameAsObjectKey:
			es[j].Value = objectKey
		case sameAsPrevious:
			es[j].Value = es[j-1].Value
		case sameAsObjectName:
			es[j].Value = name
		default:
			es[j].Value, enc = enc[:l-valueOffset], enc[l-valueOffset:]
		}
	}
	return es, enc
}

// skipEntries returns the number of entries of the index at the start of
// enc (past the provenance), and the rest of enc after them, without
// decoding them.
func skipEntries(enc string) (int, string) {
	if enc == "" {
		return 0, ""
	}
	count, enc := uvarint(enc)
	for range count {
		var l, v uint64
		l, enc = uvarint(enc)
		if l&1 == 1 {
			_, enc = uvarint(enc) // the bytes shared with the key before
		}
		enc = enc[l>>1:]
		if v, enc = uvarint(enc); v >= valueOffset {
			enc = enc[v-valueOffset:]
		}
	}
	return int(count), enc
}
