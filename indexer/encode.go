package indexer

import (
	"encoding/binary"
	"strconv"
	"strings"
)

// An object's encoding: the one string the writer keeps per object, from
// which every key and value the indexes hold is cut (see Source.objects).

// Marks of encode for a value that is not written out.
const (
	sameAsObjectKey = 0 // the value is the object key
	sameAsPrevious  = 1 // the value is the previous entry's value
	valueOffset     = 2 // otherwise: length + valueOffset, then the bytes
)

// encode packs an object's normalized entries into one string: its
// provenance (see encodeMeta), then per index the number of entries, then
// each key and value with its length. A value equal to the object key, or
// to the previous value, is stored as a mark, not a copy.
func encode(objectKey string, meta Meta, entries [][]Entry) string {
	return encodeAfter(encodeMeta(nil, meta), objectKey, entries)
}

// encodeAfter is encode with the provenance already encoded (head).
func encodeAfter(head []byte, objectKey string, entries [][]Entry) string {
	size := len(head)
	for _, es := range entries {
		size++
		for _, e := range es {
			size += 2 + len(e.Key) + 2 + len(e.Value)
		}
	}
	return string(appendEncoding(make([]byte, 0, size), objectKey, head, entries))
}

// appendEncoding appends to b what encodeAfter returns.
func appendEncoding(b []byte, objectKey string, head []byte, entries [][]Entry) []byte {
	b = append(b, head...)
	for _, es := range entries {
		b = binary.AppendUvarint(b, uint64(len(es)))
		prev := ""
		for j, e := range es {
			b = binary.AppendUvarint(b, uint64(len(e.Key)))
			b = append(b, e.Key...)
			switch {
			case e.Value == objectKey:
				b = append(b, sameAsObjectKey)
			case j > 0 && e.Value == prev:
				b = append(b, sameAsPrevious)
			default:
				b = binary.AppendUvarint(b, uint64(len(e.Value))+valueOffset)
				b = append(b, e.Value...)
			}
			prev = e.Value
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

// decode unpacks what encode packed, for n indexes. The strings it returns
// are substrings of enc (or objectKey).
func decode(enc, objectKey string, n int) [][]Entry {
	return decodeInto(make([][]Entry, n), enc, objectKey)
}

// decodeInto is decode into out (len(out) indexes), reusing the room of
// out's slices: what it returns is valid until the next call with out.
func decodeInto(out [][]Entry, enc, objectKey string) [][]Entry {
	n := len(out)
	_, enc = splitMeta(enc)
	next := func() int {
		v, rest := uvarint(enc)
		enc = rest
		return int(v)
	}
	for i := range n {
		if enc == "" {
			out[i] = out[i][:0] // none
			continue
		}
		count := next()
		es := out[i][:0]
		if es == nil || cap(es) < count {
			es = make([]Entry, count)
		}
		es = es[:count]
		for j := range count {
			l := next()
			es[j].Key, enc = enc[:l], enc[l:]
			switch l := next(); l {
			case sameAsObjectKey:
				es[j].Value = objectKey
			case sameAsPrevious:
				es[j].Value = es[j-1].Value
			default:
				es[j].Value, enc = enc[:l-valueOffset], enc[l-valueOffset:]
			}
		}
		out[i] = es
	}
	return out
}
