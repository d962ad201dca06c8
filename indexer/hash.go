package indexer

import "math/bits"

// The hash of index keys follows wyhash's construction (public domain, by
// Wang Yi): 128-bit multiplies of the key's 8-byte words, folded. It reads
// a key of up to 16 bytes with two loads and stays in registers, so a
// lookup's first miss is the table, not the hash.
//
// wyhash mixes a word with a public constant (wymix(a^p, b^seed)); a key
// whose word equals the constant zeroes the product whatever the seed, so
// such keys collide under every seed and can be chosen to pile onto one
// group. Here every multiply takes a secret on both sides: the two words of
// a hashSeed, drawn per process. To zero a product an attacker must guess a
// secret.
const (
	wyp0 = 0xa0761d6478bd642f
	wyp1 = 0xe7037ed1a0b428db
	wyp2 = 0x8ebc6af09c88c6e3
)

// hashSeed is the secret of one Store's key hash.
type hashSeed struct{ a, b uint64 }

// newHashSeed derives the two secret words from a random seed.
func newHashSeed(seed uint64) hashSeed {
	a := wymix(seed^wyp0, wyp1)
	b := wymix(seed^wyp2, wyp0)
	// A zero word would be no secret: wymix(x, 0) is 0.
	return hashSeed{a: a | 1, b: b | 1<<63}
}

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

// fold is the last step of every hash: the length and the mixed words,
// each against a secret.
func fold(hs hashSeed, n int, x uint64) uint64 {
	return wymix(hs.b^uint64(n), x^hs.a)
}

// hashKey returns the seeded hash of an index key.
func hashKey(hs hashSeed, s string) uint64 {
	n := len(s)
	var a, b uint64
	switch {
	case n > 16:
		return hashLong(hs, s)
	case n >= 8:
		a, b = le64(s, 0), le64(s, n-8)
	case n >= 4:
		a, b = le32(s, 0)<<32|le32(s, (n>>3)<<2), le32(s, n-4)<<32|le32(s, n-4-(n>>3)<<2)
	case n > 0:
		a = uint64(s[0])<<16 | uint64(s[n>>1])<<8 | uint64(s[n-1])
	}
	return fold(hs, n, wymix(a^hs.a, b^hs.b))
}

// hashLong hashes a key of more than 16 bytes: 16 bytes per round, then
// the last 16. Each round mixes the running state into the second word, so
// a round that an attacker could zero would still need the state.
func hashLong(hs hashSeed, s string) uint64 {
	n := len(s)
	state := hs.b
	for i := 0; n-i > 16; i += 16 {
		state = wymix(le64(s, i)^hs.a, le64(s, i+8)^state) ^ state
	}
	a, b := le64(s, n-16), le64(s, n-8)
	return fold(hs, n, wymix(a^hs.a^wyp1, b^state^wyp2))
}
