package indexer

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"testing"
)

func TestLookupHashIsHashKey(t *testing.T) {
	hs := newHashSeed(42)
	for n := 0; n <= 40; n++ {
		key := "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH"[:n]
		tb := build(3, []change{{hash: hashKey(hs, key), key: key, values: []string{"v"}}})
		if got := tb.lookup(hs, key); len(got) != 1 {
			t.Fatalf("len %d: lookup does not find what hashKey placed", n)
		}
	}
}

// TestNoSeedIndependentCollisions: keys built around wyhash's public
// constants (a word equal to one zeroes a product in wyhash itself) must
// not collide, whatever the seed: the per-process seed protects every key.
func TestNoSeedIndependentCollisions(t *testing.T) {
	var words [][8]byte
	for _, p := range []uint64{0, wyp0, wyp1, wyp2, wyp0 ^ wyp1, wyp1 ^ wyp2} {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], p)
		words = append(words, w)
	}
	for _, seed := range []uint64{0, 1, 42, 1 << 63, ^uint64(0)} {
		hs := newHashSeed(seed)
		for _, w := range words {
			for _, n := range []int{16, 24, 40, 100} {
				seen := map[uint64]string{}
				for i := range 256 {
					// The attacker's word first (and at every 16 bytes),
					// then anything.
					b := make([]byte, n)
					for j := 0; j+8 <= n; j += 16 {
						copy(b[j:], w[:])
					}
					b[n-1] = byte(i)
					b[n-9] ^= byte(i * 7)
					key := string(b)
					h := hashKey(hs, key)
					if other, dup := seen[h]; dup && other != key {
						t.Fatalf("seed %d, length %d: %q and %q collide", seed, n, other, key)
					}
					seen[h] = key
				}
			}
		}
	}
}

var hashSink uint64

// BenchmarkKeyHash compares the key hash with hash/maphash on keys of the
// shapes that indexes hold (docs/how-it-works.md, "Written by hand, and
// why"); compare the two with benchstat after removing the last element
// of the names.
func BenchmarkKeyHash(b *testing.B) {
	shapes := []struct {
		name   string
		format func(i int) string
	}{
		{"label-5B", func(i int) string { return fmt.Sprintf("w%04d", i) }},
		{"ip-port-13B", func(i int) string { return fmt.Sprintf("10.%d.%d.%d:80", i>>8&7, i&255, i%7) }},
		{"model-key-14B", func(i int) string { return fmt.Sprintf("model-%06d-%d", i, i%3) }},
		{"object-ns-name-24B", func(i int) string { return fmt.Sprintf("payments/checkout-%06d", i) }},
		{"long-60B", func(i int) string {
			return fmt.Sprintf("cluster-east/namespace-production/service-%06d/port-http", i)
		}},
	}
	hs := newHashSeed(7)
	ms := maphash.MakeSeed()
	for _, shape := range shapes {
		keys := make([]string, 1024)
		for i := range keys {
			keys[i] = shape.format(i)
		}
		b.Run(shape.name+"/handwritten", func(b *testing.B) {
			i := 0
			for b.Loop() {
				hashSink += hashKey(hs, keys[i&1023])
				i++
			}
		})
		b.Run(shape.name+"/maphash", func(b *testing.B) {
			i := 0
			for b.Loop() {
				hashSink += maphash.String(ms, keys[i&1023])
				i++
			}
		})
	}
}
