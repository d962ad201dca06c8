package indexer

import "testing"

func TestLookupHashIsHashKey(t *testing.T) {
	for n := 0; n <= 40; n++ {
		key := "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH"[:n]
		tb := build(3, []change{{hash: hashKey(42, key), key: key, values: []string{"v"}}})
		if got := tb.lookup(42, key); len(got) != 1 {
			t.Fatalf("len %d: lookup does not find what hashKey placed", n)
		}
	}
}
