package indexer

import (
	"encoding/binary"
	"math/bits"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// table maps index keys to their values (or to object keys): an
// open-addressing hash table split into 1<<bits pages by the top bits of
// the key's hash, the pages held in chunks of 64. A table is immutable once
// published; a write copies the pages it touches and their chunks, and
// shares everything else, so its cost is a page and a chunk, not the table.
//
// A page is an array of groups of 8 slots, probed group by group from the
// key's home group, as in a Swiss table: one word of control bytes tells
// which slots may hold the key and whether the group has room, so a lookup
// reads a chunk pointer and a page's slice header (both small, hot
// arrays), one control word, the slot that matches, and the key's bytes to
// confirm it.
type table struct {
	bits uint
	dir  []*chunk
}

const chunkBits = 6

// chunk holds 64 pages.
type chunk [1 << chunkBits][]group

const (
	groupSlots = 8
	lsb        = 0x0101010101010101
	msb        = 0x8080808080808080
)

// group is 8 slots and their control bytes: 0 for an empty slot, deleted
// for a slot whose key went while its group was full, else 0x80 | the low 7
// bits of the key's hash.
type group struct {
	ctrl  uint64
	slots [groupSlots]slot
}

// slot is one key of a page and its values; every key in a table has at
// least one value. It holds two pointers and two lengths, 24 bytes: no
// capacity (a table's values are never appended to) and no hash, which a
// page laid out anew computes again from a short key, and reads from the
// 8 bytes before a long one's (see slotHash).
type slot struct {
	kptr *byte
	vptr *string
	klen uint32 // keys come from objects of at most a few megabytes
	vlen uint32
}

func (s *slot) key() string { return unsafe.String(s.kptr, s.klen) }

// values returns the slot's values; their capacity is their length, so
// that an append by a caller copies them.
func (s *slot) values() []string { return valuesOf(s) }

// valuesOf is s's values, made without unsafe.Slice's checks (a lookup
// returns them): vptr is nil only when vlen is 0.
func valuesOf(s *slot) []string {
	n := int(s.vlen)
	h := struct {
		data *string
		len  int
		cap  int
	}{s.vptr, n, n}
	return *(*[]string)(unsafe.Pointer(&h))
}

// setValues points the slot at values, which must not be empty.
func (s *slot) setValues(values []string) {
	s.vptr, s.vlen = unsafe.SliceData(values), uint32(len(values))
}

// ctrlOf returns the control byte of a tag: its low 7 bits (its home
// group comes from its high bits).
func ctrlOf(tag uint32) uint64 { return 0x80 | uint64(tag&0x7f) }

// matches returns a byte mask (bit 7 of each byte) of the slots whose
// control byte may be c; it can report a slot that is not (rarely), never
// miss one that is.
func matches(ctrl, c uint64) uint64 {
	v := ctrl ^ (lsb * c)
	return (v - lsb) &^ v & msb
}

// deleted marks a slot whose key went: a probe goes on past it, as past a
// key. No control byte is 0x01, which keeps empties exact.
const deleted = 0x7f

// empties returns a byte mask of the empty slots: exact.
func empties(ctrl uint64) uint64 { return (ctrl - lsb) &^ ctrl & msb }

// emptyPage is the page of a table's pages that hold no key: one empty
// group, never written.
var emptyPage = []group{{}}

// newTable returns a table of 1<<bits empty pages.
func newTable(bits uint) table {
	t := table{bits: bits, dir: make([]*chunk, max(1, 1<<bits>>chunkBits))}
	for i := range t.dir {
		c := new(chunk)
		for j := range c {
			c[j] = emptyPage
		}
		t.dir[i] = c
	}
	return t
}

// page returns the page number of a hash: its top bits (none when bits is
// 0).
func (t *table) page(h uint64) int { return int(h >> (63 - t.bits) >> 1) }

// pageAt returns page number i.
func (t *table) pageAt(i int) []group { return t.dir[i>>chunkBits][i&(1<<chunkBits-1)] }

// home returns a tag's first group in a page of n groups.
func home(tag uint32, n int) int { return int(uint64(tag) * uint64(n) >> 32) }

// lookup returns the values of key, or nil. The hash of keys of 8 to 16
// bytes (most keys) is computed in line: hashKey's, without the call.
func (t *table) lookup(hs hashSeed, key string) []string {
	var h uint64
	if n := len(key); n >= 8 && n <= 16 {
		h = wymix(hs.b^uint64(n), wymix(le64(key, 0)^hs.a, le64(key, n-8)^hs.b)^hs.a)
	} else {
		h = hashKey(hs, key)
	}
	pi := h >> (63 - t.bits) >> 1
	p := t.dir[pi>>chunkBits][pi&(1<<chunkBits-1)]
	c := ctrlOf(uint32(h))
	i := int(uint64(uint32(h)) * uint64(len(p)) >> 32)
	for {
		g := &p[i]
		for m := matches(g.ctrl, c); m != 0; m &= m - 1 {
			s := &g.slots[bits.TrailingZeros64(m)>>3]
			if sameKey(s, key) {
				return valuesOf(s)
			}
		}
		if empties(g.ctrl) != 0 {
			return nil
		}
		if i++; i == len(p) {
			i = 0
		}
	}
}

// sameKey reports whether s holds key. Keys of 8 to 16 bytes are
// compared with two loads each, without a call.
func sameKey(s *slot, key string) bool {
	n := len(key)
	if int(s.klen) != n {
		return false
	}
	if n < 8 || n > 16 {
		return s.key() == key
	}
	k := s.key()
	return le64(k, 0) == le64(key, 0) && le64(k, n-8) == le64(key, n-8)
}

// find returns the group and slot of key, whose hash is h, in page p, or
// -1, -1.
func find(p []group, h uint64, key string) (int, int) {
	c := ctrlOf(uint32(h))
	i := home(uint32(h), len(p))
	for {
		g := &p[i]
		for m := matches(g.ctrl, c); m != 0; m &= m - 1 {
			j := bits.TrailingZeros64(m) >> 3
			if g.slots[j].key() == key {
				return i, j
			}
		}
		if empties(g.ctrl) != 0 {
			return -1, -1
		}
		if i++; i == len(p) {
			i = 0
		}
	}
}

// layout returns a new page holding the keys of the given changes (which
// must all have values), filled to at most 7/8 (see newPage). The page
// keeps the changes' short key strings: the caller owns them.
func layout(changes []change) []group {
	p := newPage(len(changes))
	var buf [128]int32
	for _, i := range homeOrder(len(p), len(changes), func(i int) uint64 { return changes[i].hash }, buf[:0]) {
		s := newSlot(&changes[i])
		insert(p, &s, changes[i].hash)
	}
	return p
}

// homeOrder returns 0..n-1 ordered by the home group, in a page of groups
// groups, of the hash that hash(i) returns (a counting sort; order of
// arrival among keys of one home). A page filled in this order has each
// key as close to its home as the page's crowding allows, as Robin Hood
// hashing places them: filled in any other order, a few keys would land
// many groups past theirs, and every lookup of one of them would probe
// all those groups (a key whose lookup probed 5 groups cost 1.8 × one at
// home, hot in the cache). The keys' distances add up to the same either
// way. buf is used when it has room.
func homeOrder(groups, n int, hash func(int) uint64, buf []int32) []int32 {
	var few [65]int32
	var start []int32
	if groups+1 <= len(few) {
		start = few[:groups+1]
	} else {
		start = make([]int32, groups+1)
	}
	var hbuf [128]int32
	var homes []int32
	if n <= len(hbuf) {
		homes = hbuf[:n]
	} else {
		homes = make([]int32, n)
	}
	for i := range n {
		g := home(uint32(hash(i)), groups)
		homes[i] = int32(g)
		start[g+1]++
	}
	// The order starts at a group that no key of an earlier home spills
	// into (one exists: a page has an empty slot), so that the keys that
	// wrap past the last group come in their turn, not after all others.
	first, carry := 0, 0
	for k := range 2 * groups {
		g := k % groups
		if k >= groups && carry == 0 {
			first = g
			break
		}
		carry = max(0, carry+int(start[g+1])-groupSlots)
	}
	if first > 0 {
		var rbuf [64]int32
		rotated := append(rbuf[:0], start[1:]...)
		for g := range groups {
			start[(g-first+groups)%groups+1] = rotated[g]
		}
		for i, g := range homes {
			homes[i] = int32((int(g) - first + groups) % groups)
		}
	}
	for g := 1; g <= groups; g++ {
		start[g] += start[g-1]
	}
	var order []int32
	if cap(buf) >= n {
		order = buf[:n]
	} else {
		order = make([]int32, n)
	}
	for i, g := range homes {
		order[start[g]] = int32(i)
		start[g]++
	}
	return order
}

// newPage returns an empty page for n keys, to be filled to at most 7/8,
// as a Swiss table is, with at least one empty slot so that every probe
// ends; the allocator's rounding adds what it adds. A fuller page would
// make lookups probe a second group more often; an emptier one costs its
// slots: 3/4 and a group more cost 5 bytes a key more than this, at
// 10,000 AppModels (BenchmarkBytesPerObject), with lookups and writes
// the same within the machine's noise.
// It returns the shared empty page for none: do not insert into it.
func newPage(n int) []group {
	if n == 0 {
		return emptyPage
	}
	g := (n*8/7 + groupSlots - 1) / groupSlots
	if g*groupSlots <= n {
		g++ // at least one empty slot: every probe ends
	}
	p := make([]group, g)
	return p[:cap(p)] // use what the allocator rounded up to
}

// insert puts s, whose key's hash is h, in the first empty slot of its
// probe sequence in p, which must not hold its key and must have room.
func insert(p []group, s *slot, h uint64) {
	tag := uint32(h)
	i := home(tag, len(p))
	for {
		g := &p[i]
		if e := empties(g.ctrl); e != 0 {
			j := bits.TrailingZeros64(e) >> 3
			g.slots[j] = *s
			g.ctrl |= ctrlOf(tag) << (8 * j)
			return
		}
		if i++; i == len(p) {
			i = 0
		}
	}
}

// usedIn returns the number of slots of p that are not empty: keys and
// deleted slots.
func usedIn(p []group) int {
	n := 0
	for g := range p {
		n += groupSlots - bits.OnesCount64(empties(p[g].ctrl))
	}
	return n
}

// keysIn returns the number of keys in p.
func keysIn(p []group) int {
	n := 0
	for g := range p {
		n += bits.OnesCount64(p[g].ctrl & msb)
	}
	return n
}

// change sets one key of a table to values; nil values delete the key.
type change struct {
	hash   uint64
	key    string
	values []string
}

// longKey is the length past which a table keeps a key's hash with it:
// a page laid out anew would otherwise hash every byte of its keys again,
// and a few keys of megabytes would make each write to their page cost
// that much.
const longKey = 64

// newSlot returns the slot of c, holding c.key itself (the caller owns
// it) when it is short, and a copy after its hash when it is long.
func newSlot(c *change) slot {
	if len(c.key) > longKey {
		return newSlotCopy(c)
	}
	s := slot{kptr: unsafe.StringData(c.key), klen: uint32(len(c.key))}
	s.setValues(c.values)
	return s
}

// newSlotCopy returns the slot of c with a copy of c.key, for a key that
// the caller only borrows (update's changes). A long key's copy follows
// its hash (see slotHash).
func newSlotCopy(c *change) slot {
	s := slot{klen: uint32(len(c.key))}
	if len(c.key) > longKey {
		b := make([]byte, 8+len(c.key))
		binary.LittleEndian.PutUint64(b, c.hash)
		copy(b[8:], c.key)
		s.kptr = &b[8]
	} else {
		s.kptr = unsafe.StringData(strings.Clone(c.key))
	}
	s.setValues(c.values)
	return s
}

// slotHash returns the hash of s's key, hashed with hs: read from before
// a long key, computed for a short one.
func slotHash(hs hashSeed, s *slot) uint64 {
	if s.klen > longKey {
		return binary.LittleEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(s.kptr), -8)), 8))
	}
	return hashKey(hs, s.key())
}

// update returns the table with changes applied, and the change in its
// number of keys. Keys must be distinct among changes, hashed with hs
// (the table's keys too: a page laid out anew hashes its keys again); the
// keys it inserts are copied (a change's key is borrowed). Pages and
// chunks that no change touches are shared with t.
func (t *table) update(hs hashSeed, changes []change) (table, int) {
	out := table{bits: t.bits, dir: slices.Clone(t.dir)}
	copied := -1 // the last chunk copied; pages come in order
	slices.SortFunc(changes, func(a, b change) int { return t.page(a.hash) - t.page(b.hash) })
	delta := 0
	for start := 0; start < len(changes); {
		pi := t.page(changes[start].hash)
		end := start + 1
		for end < len(changes) && t.page(changes[end].hash) == pi {
			end++
		}
		page, d := updatePage(hs, t.pageAt(pi), changes[start:end])
		delta += d
		if ci := pi >> chunkBits; ci != copied {
			c := *out.dir[ci]
			out.dir[ci] = &c
			copied = ci
		}
		out.dir[pi>>chunkBits][pi&(1<<chunkBits-1)] = page
		start = end
	}
	return out, delta
}

// updatePage returns a copy of page old with changes applied, and the
// change in its number of keys. The copy is changed in place: values
// replaced, keys that go marked empty (or deleted, if their group is full:
// a probe must not stop there), new keys inserted; unless the page would be
// more than 7/8 used, keys and deleted slots together, or less than 3/8
// full of keys (and larger than one group): then it is laid out anew,
// without deleted slots, at the size for its keys. A page laid out anew is
// up to 7/8 full, so the next key it gains may lay it out again; that costs
// about what the copy of the page that every write makes costs (the keys
// are inserted again, short ones hashed again). It shrinks only after
// losing more than half its keys, and so follows its keys down as well as
// up.
// (With 1/4, a store scaled down from 50,000 keys to 500 by deletes held
// 1.3x the same keys built fresh; with 3/8, 1.1x.)
func updatePage(hs hashSeed, old []group, changes []change) ([]group, int) {
	// at[i] is the slot of changes[i] in old, g*groupSlots+j, or -1.
	var buf [8]int
	at := buf[:0]
	inserts, removes := 0, 0
	for i := range changes {
		c := &changes[i]
		g, j := find(old, c.hash, c.key)
		if g >= 0 {
			at = append(at, g*groupSlots+j)
			if len(c.values) == 0 {
				removes++
			}
			continue
		}
		at = append(at, -1)
		if len(c.values) > 0 {
			inserts++
		}
	}
	n := keysIn(old)
	slots := len(old) * groupSlots
	if (usedIn(old)+inserts)*8 <= slots*7 && (len(old) == 1 || (n+inserts-removes)*8 >= slots*3) {
		p := slices.Clone(old)
		for i := range changes {
			c := &changes[i]
			k := at[i]
			switch {
			case k >= 0 && len(c.values) > 0:
				p[k/groupSlots].slots[k%groupSlots].setValues(c.values)
			case k >= 0:
				g := &p[k/groupSlots]
				j := k % groupSlots
				mark := uint64(deleted)
				if empties(g.ctrl) != 0 {
					mark = 0
				}
				g.ctrl = g.ctrl&^(0xff<<(8*j)) | mark<<(8*j)
				g.slots[j] = slot{}
			case len(c.values) > 0:
				s := newSlotCopy(c)
				insert(p, &s, c.hash)
			}
		}
		return p, inserts - removes
	}
	// Lay out anew: the slots that no change names, then the changes.
	size := n
	for i, k := range at {
		if k >= 0 {
			size--
		}
		if len(changes[i].values) > 0 {
			size++
		}
	}
	p := newPage(size)
	// named marks the slots that a change names, one bit each: a commit
	// may change every key of a page, and a search of at per slot would
	// cost the square of that.
	var few [4]uint64
	var named []uint64
	if w := (slots + 63) / 64; w <= len(few) {
		named = few[:w]
	} else {
		named = make([]uint64, w)
	}
	for _, k := range at {
		if k >= 0 {
			named[k/64] |= 1 << (k % 64)
		}
	}
	// The slots to lay out, the kept ones then the inserted ones, with
	// their hashes, placed in the order of their homes (see homeOrder).
	// A slot is named by a reference, not copied: k >= 0 is old's slot k,
	// k < 0 is changes[-k-1]. Pages hold about keysPerPage keys (up to
	// four times that before the index gets more pages); those of up to
	// 128 keys are ordered on the stack.
	var refBuf [128]int32
	var hashBuf [128]uint64
	refs, hashes := refBuf[:0], hashBuf[:0]
	if size > len(refBuf) {
		refs, hashes = make([]int32, 0, size), make([]uint64, 0, size)
	}
	for g := range old {
		for j := range old[g].slots {
			if k := g*groupSlots + j; old[g].ctrl>>(8*j)&0x80 != 0 && named[k/64]&(1<<(k%64)) == 0 {
				refs, hashes = append(refs, int32(k)), append(hashes, slotHash(hs, &old[g].slots[j]))
			}
		}
	}
	for i := range changes {
		if c := &changes[i]; len(c.values) > 0 {
			refs, hashes = append(refs, int32(-i-1)), append(hashes, c.hash)
		}
	}
	var order [128]int32
	for _, i := range homeOrder(len(p), len(refs), func(i int) uint64 { return hashes[i] }, order[:0]) {
		if k := refs[i]; k >= 0 {
			insert(p, &old[k/groupSlots].slots[k%groupSlots], hashes[i])
		} else {
			s := newSlotCopy(&changes[-k-1])
			insert(p, &s, hashes[i])
		}
	}
	return p, inserts - removes
}

// build returns a table of 1<<bits pages holding the given keys, which must
// be distinct. The table keeps the keys' strings: the caller owns them.
func build(bits uint, changes []change) table {
	t := newTable(bits)
	groups := make([][]change, 1<<bits)
	if inPageOrder(&t, changes) {
		// A bulk build's keys come sorted by hash: each page's are a run
		// of them, laid out from where they are.
		for i := 0; i < len(changes); {
			pi, end := t.page(changes[i].hash), i+1
			for end < len(changes) && t.page(changes[end].hash) == pi {
				end++
			}
			groups[pi], i = changes[i:end:end], end
		}
	} else {
		counts := make([]int, 1<<bits)
		for i := range changes {
			counts[t.page(changes[i].hash)]++
		}
		for i := range changes {
			c := &changes[i]
			if len(c.values) == 0 {
				continue
			}
			pi := t.page(c.hash)
			if groups[pi] == nil {
				groups[pi] = make([]change, 0, counts[pi])
			}
			groups[pi] = append(groups[pi], *c)
		}
	}
	// Pages are laid out apart: a large table on every core (a restore
	// or a first list of many objects waits for it).
	workers := 1
	if len(changes) >= parallelBuild {
		workers = min(runtime.GOMAXPROCS(0), 4)
	}
	if workers == 1 {
		for pi, g := range groups {
			t.dir[pi>>chunkBits][pi&(1<<chunkBits-1)] = layout(g)
		}
		return t
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for pi := w; pi < len(groups); pi += workers {
				t.dir[pi>>chunkBits][pi&(1<<chunkBits-1)] = layout(groups[pi])
			}
		})
	}
	wg.Wait()
	return t
}

// inPageOrder reports whether changes are in the order of t's pages, none
// without values: what build can lay out where they are.
func inPageOrder(t *table, changes []change) bool {
	for i := range changes {
		if len(changes[i].values) == 0 || i > 0 && t.page(changes[i].hash) < t.page(changes[i-1].hash) {
			return false
		}
	}
	return true
}

// parallelBuild is the number of keys from which build lays pages out on
// several cores.
const parallelBuild = 1 << 15

// all calls f for every key of the table and its values.
func (t *table) all(f func(key string, values []string)) {
	for _, c := range t.dir {
		for _, p := range c {
			for g := range p {
				for j := range p[g].slots {
					if p[g].ctrl>>(8*j)&0x80 != 0 {
						f(p[g].slots[j].key(), p[g].slots[j].values())
					}
				}
			}
		}
	}
}

// rehash returns the table spread over 1<<bits pages.
func (t *table) rehash(bits uint, hash func(string) uint64) table {
	var changes []change
	t.all(func(key string, values []string) {
		changes = append(changes, change{hash: hash(key), key: key, values: values})
	})
	return build(bits, changes)
}
