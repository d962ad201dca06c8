package indexer

import "math/bits"

// The hash of index keys is wyhash's construction (public domain, by Wang
// Yi): 128-bit multiplies of the key's 8-byte words with the seed and odd
// constants. It reads a key of up to 16 bytes with two loads and stays in
// registers, so a lookup's first miss is the table, not the hash.
const (
	wyp0 = 0xa0761d6478bd642f
	wyp1 = 0xe7037ed1a0b428db
	wyp2 = 0x8ebc6af09c88c6e3
)

func wymix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// le64 and le32 read little-endian words of s at i; the compiler makes
// each one load.
func le64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string, i int) uint64 {
	s = s[i : i+4]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24
}

// hashKey returns the seeded hash of an index key.
func hashKey(seed uint64, s string) uint64 {
	n := len(s)
	seed ^= wyp0
	var a, b uint64
	switch {
	case n > 16:
		return hashLong(seed, s)
	case n >= 8:
		a, b = le64(s, 0), le64(s, n-8)
	case n >= 4:
		a, b = le32(s, 0)<<32|le32(s, (n>>3)<<2), le32(s, n-4)<<32|le32(s, n-4-(n>>3)<<2)
	case n > 0:
		a = uint64(s[0])<<16 | uint64(s[n>>1])<<8 | uint64(s[n-1])
	}
	return wymix(wyp1^uint64(n), wymix(a^wyp1, b^seed))
}

// hashLong hashes a key of more than 16 bytes: 16 bytes per round, then
// the last 16.
func hashLong(seed uint64, s string) uint64 {
	n := len(s)
	i := 0
	for ; n-i > 16; i += 16 {
		seed = wymix(le64(s, i)^wyp1, le64(s, i+8)^seed)
	}
	a, b := le64(s, n-16), le64(s, n-8)
	return wymix(wyp1^uint64(n), wymix(a^wyp1, b^seed^wyp2))
}
