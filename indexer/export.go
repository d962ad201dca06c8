package indexer

// Export calls f with every object of src as of one commit: its key, its
// entries for each index of the source (normalized: sorted, distinct) and
// its payload (nil if it has none), in no particular order, and returns
// how many there were. It holds the writer lock only while it copies the
// object table (two string headers per object); f runs after, without it,
// and may take as long as it likes. The strings and slices f gets must not
// be changed; entries are valid only until f returns.
//
// A source that a Reconfigure removed exports nothing.
func (src *Source) Export(f func(key string, entries [][]Entry, payload any)) int {
	type encoded struct{ key, enc string }
	src.s.mu.Lock()
	if src.removed {
		src.s.mu.Unlock()
		return 0
	}
	snap := src.s.current.Load()
	width := len(src.indexes)
	objs := make([]encoded, 0, len(src.objects))
	for k, enc := range src.objects {
		objs = append(objs, encoded{k, enc})
	}
	src.s.mu.Unlock()
	buf := make([][]Entry, width)
	for _, o := range objs {
		var payload any
		if p, ok := snap.Payload(src, o.key); ok {
			payload = p
		}
		f(o.key, decodeInto(buf, o.enc, o.key), payload)
	}
	return len(objs)
}
