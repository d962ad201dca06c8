package indexer

import (
	"encoding/binary"
	"iter"
	"math/bits"
	"slices"
	"unsafe"
)

// objectSet is the writer's set of a source's objects: each object's
// record, one string that holds its object key and its encoding (see
// encode), so that an update or delete can withdraw exactly what the
// object contributed. It is what map[string]string from object key to
// encoding would be, in less memory: a slot is one pointer, to the start
// of a record that begins with its own lengths, and the object key is
// not a string of its own.
//
// An open-addressing table with linear probing, keys hashed with the
// Store's secret seed (object keys are chosen by whoever may create
// objects). A delete shifts the keys after it back (no tombstones), and
// the table is resized when it falls below an eighth full, so that its
// memory follows the objects it holds, not the most it ever held. Not
// safe for concurrent use: the writer's, under its Source's mu.
//
// The slots are split into pages of at most 1<<objectPageBits, copied on
// write once published: freeze returns the set as it is, an objectView
// that readers use without a lock (Explain reads the objects of the
// snapshot it explains), and the writer's next change to a page copies
// that page (2 KiB) and, once per commit, the directory of pages (8 bytes
// a page).
type objectSet struct {
	seed  hashSeed
	pages []*objectPage
	size  int // slots: a power of two
	shift uint
	n     int
	// epoch counts the freezes: a page of this epoch, and the directory
	// when dirEpoch is this epoch, were copied since the last freeze and
	// are the writer's alone; the others may be published.
	epoch, dirEpoch uint64
	dirty           bool // changed since the last freeze
}

// objectPage is a page of an objectSet's slots: a record's first byte, or
// nil.
type objectPage struct {
	epoch uint64
	slots []*byte
}

// objectPageBits bounds the slots of a page: 256, 2 KiB.
const objectPageBits = 8

// objectView is an objectSet as it was when frozen: never changed, read
// without a lock.
type objectView struct {
	seed  hashSeed
	pages []*objectPage
	shift uint
	n     int
}

// freeze returns the set as it is now, and makes the writer's next
// change to any page copy it.
func (m *objectSet) freeze() objectView {
	v := objectView{seed: m.seed, pages: m.pages, shift: m.shift, n: m.n}
	m.epoch++
	m.dirty = false
	return v
}

// slot returns slot i.
func (m *objectSet) slot(i int) *byte {
	return m.pages[i>>m.shift].slots[i&(1<<m.shift-1)]
}

// set writes slot i, copying its page (and the directory) first when they
// may be published.
func (m *objectSet) set(i int, p *byte) {
	pi := i >> m.shift
	pg := m.pages[pi]
	if pg.epoch != m.epoch {
		if m.dirEpoch != m.epoch {
			m.pages = slices.Clone(m.pages)
			m.dirEpoch = m.epoch
		}
		pg = &objectPage{epoch: m.epoch, slots: slices.Clone(pg.slots)}
		m.pages[pi] = pg
	}
	pg.slots[i&(1<<m.shift-1)] = p
	m.dirty = true
}

// compact moves the slots into one fresh array, and the pages into
// another (see Store.Compact): after churn, the current pages lie among
// the spans of the Go heap that their old copies filled.
func (m *objectSet) compact() {
	per := 1 << m.shift
	all := make([]*byte, m.size)
	ps := make([]objectPage, len(m.pages))
	pages := make([]*objectPage, len(m.pages))
	for i, pg := range m.pages {
		copy(all[i*per:], pg.slots)
		ps[i] = objectPage{epoch: m.epoch, slots: all[i*per : (i+1)*per : (i+1)*per]}
		pages[i] = &ps[i]
	}
	m.pages, m.dirEpoch, m.dirty = pages, m.epoch, true
}

// makeSlots gives the set an empty table of size slots, its own.
func (m *objectSet) makeSlots(size int) {
	m.size = size
	m.shift = uint(min(bits.Len(uint(size-1)), objectPageBits))
	m.pages = make([]*objectPage, size>>m.shift)
	for i := range m.pages {
		m.pages[i] = &objectPage{epoch: m.epoch, slots: make([]*byte, 1<<m.shift)}
	}
	m.dirEpoch = m.epoch
	m.dirty = true
}

// The record of an object: uvarint(len(object key)), uvarint(len(encoding)),
// the object key, the encoding.

// newRecord returns the record of an object key and the encoding of head
// (the provenance) and entries (see appendEncoding), in one allocation,
// with the object key and encoding that are its substrings.
func newRecord(objectKey string, head []byte, entries [][]Entry) (rec, key, enc string) {
	// The encoding is written first, on the stack when it is small, for
	// its length, which the record starts with.
	var scratch [256]byte
	e := appendEncoding(scratch[:0], objectKey, head, entries)
	var pre [2 * binary.MaxVarintLen64]byte
	p := binary.AppendUvarint(pre[:0], uint64(len(objectKey)))
	p = binary.AppendUvarint(p, uint64(len(e)))
	out := make([]byte, 0, len(p)+len(objectKey)+len(e))
	out = append(out, p...)
	out = append(out, objectKey...)
	out = append(out, e...)
	rec = unsafe.String(unsafe.SliceData(out), len(out))
	key, enc = splitRecord(rec)
	return rec, key, enc
}

// splitRecord returns the object key and the encoding of a record.
func splitRecord(rec string) (key, enc string) {
	kl, rest := uvarint(rec)
	el, rest := uvarint(rest)
	return rest[:kl], rest[kl : kl+el]
}

// recordAt returns the record whose first byte is p.
func recordAt(p *byte) string {
	kl, i := uvarintAt(p, 0)
	el, i := uvarintAt(p, i)
	return unsafe.String(p, i+int(kl)+int(el))
}

// uvarintAt reads the uvarint at p+i, and returns it and the offset after
// it.
func uvarintAt(p *byte, i int) (uint64, int) {
	var v uint64
	for shift := 0; ; shift += 7 {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		i++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, i
		}
	}
}

// newObjectSet returns an empty set with room for n objects.
func newObjectSet(seed hashSeed, n int) *objectSet {
	m := &objectSet{seed: seed, epoch: 1}
	m.makeSlots(slotsFor(n))
	return m
}

// slotsFor returns the table size for n objects: the least power of two
// (at least 8) that n fills to at most 13/16. A table grows past 13/16
// full (to between 13/32 and 13/16) and shrinks below 1/8. Past 13/16 the
// clusters of linear probing grow long: a new key probes about 15 slots
// there (33 at 7/8), a delete shifts and hashes again the records of its
// cluster, and each probe reads a record.
func slotsFor(n int) int {
	need := (16*n + 12) / 13
	if need <= 8 {
		return 8
	}
	return 1 << bits.Len(uint(need-1))
}

// Len returns the number of objects.
func (m *objectSet) Len() int { return m.n }

// find returns the slot of key, or of the empty slot where it would go,
// and whether the key is there.
func (m *objectSet) find(key string) (int, bool) {
	mask := m.size - 1
	i := int(hashKey(m.seed, key)) & mask
	for {
		p := m.slot(i)
		if p == nil {
			return i, false
		}
		if k, _ := splitRecord(recordAt(p)); k == key {
			return i, true
		}
		i = (i + 1) & mask
	}
}

// Get returns the encoding of the object key's object.
func (m *objectSet) Get(key string) (enc string, ok bool) {
	i, ok := m.find(key)
	if !ok {
		return "", false
	}
	_, enc = splitRecord(recordAt(m.slot(i)))
	return enc, true
}

// Put sets the record of its object key, and reports whether the key is
// new.
func (m *objectSet) Put(rec string) bool {
	key, _ := splitRecord(rec)
	i, ok := m.find(key)
	m.set(i, unsafe.StringData(rec))
	if ok {
		return false
	}
	m.n++
	if m.n*16 > m.size*13 {
		m.resize(slotsFor(m.n))
	}
	return true
}

// Delete removes the object key's record, if any.
func (m *objectSet) Delete(key string) {
	i, ok := m.find(key)
	if !ok {
		return
	}
	// Shift back the records after i that their home allows, up to the
	// next empty slot: a probe from any record's home still reaches it.
	mask := m.size - 1
	for j := (i + 1) & mask; m.slot(j) != nil; j = (j + 1) & mask {
		k, _ := splitRecord(recordAt(m.slot(j)))
		h := int(hashKey(m.seed, k)) & mask
		// The record at j may move to i when i lies on its probe path,
		// from its home h to j (cyclically).
		if (j-h)&mask >= (j-i)&mask {
			m.set(i, m.slot(j))
			i = j
		}
	}
	m.set(i, nil)
	m.n--
	if m.size > 16 && m.n*8 < m.size {
		m.resize(slotsFor(m.n))
	}
}

// resize moves every record to a table of size slots.
func (m *objectSet) resize(size int) {
	old := m.pages
	m.makeSlots(size)
	mask := size - 1
	for _, pg := range old {
		for _, p := range pg.slots {
			if p == nil {
				continue
			}
			k, _ := splitRecord(recordAt(p))
			i := int(hashKey(m.seed, k)) & mask
			for m.slot(i) != nil {
				i = (i + 1) & mask
			}
			m.pages[i>>m.shift].slots[i&(1<<m.shift-1)] = p
		}
	}
}

// All yields every object's key and encoding, in no order. The set may be
// changed while it yields only by a Put of a key it holds (which keeps
// the key's slot).
func (m *objectSet) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for pi := range m.pages {
			// Read the page at each step: a Put may copy it.
			for j := range 1 << m.shift {
				p := m.pages[pi].slots[j]
				if p == nil {
					continue
				}
				if !yield(splitRecord(recordAt(p))) {
					return
				}
			}
		}
	}
}

// Records yields the first byte of every object's record (see
// recordAt), in no order; the set must not change while it yields.
func (m *objectSet) Records() iter.Seq[*byte] {
	return func(yield func(*byte) bool) {
		for _, pg := range m.pages {
			for _, p := range pg.slots {
				if p != nil && !yield(p) {
					return
				}
			}
		}
	}
}

// All yields every object's key and encoding, in no order.
func (v *objectView) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for _, pg := range v.pages {
			for _, p := range pg.slots {
				if p == nil {
					continue
				}
				if !yield(splitRecord(recordAt(p))) {
					return
				}
			}
		}
	}
}
