package indexer

// shrinkMin is the peak count under which a map is never copied to shrink
// it: a map that small costs little however empty it is.
const shrinkMin = 16

// shrunk returns m, or, when its count has fallen below a quarter of
// *peak (the largest count m has had since it was made), a copy of m sized
// for its count; it keeps *peak up to date. A delete may leave a Go map
// at the size of its peak forever, and maps.Clone keeps that size too.
//
// The copy costs the count, at most a quarter of the peak, and follows at
// least three quarters of the peak in deletes since the map was made:
// O(1) per delete, amortized. A count that goes up and down by less than
// that never copies.
func shrunk[K comparable, V any](m map[K]V, peak *int) map[K]V {
	n := len(m)
	if n > *peak {
		*peak = n
		return m
	}
	if *peak < shrinkMin || n*4 >= *peak {
		return m
	}
	c := make(map[K]V, n)
	for k, v := range m {
		c[k] = v
	}
	*peak = n
	return c
}
