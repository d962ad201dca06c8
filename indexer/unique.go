package indexer

import (
	"math"
	"slices"
	"sort"
	"strings"
)

// Unique indexes: a key that several objects claim with different values
// answers the oldest claimant's values (SourceSpec.Unique).
//
// The index's table holds every value of every key, as any index does;
// what a unique index adds is, for the few keys in conflict, the values
// answered (indexSnap.chosen). To choose, the writer keeps the claims on
// each key that has more than one value: which object gives which value,
// and when the object was created. A key with one value needs no claims,
// so an index without conflicts costs nothing more than any other; a key
// that gains a second value finds its claimants among the objects its
// values name (see claimsByName), or among the objects the source lists
// under the key when it keeps them (SourceSpec.Objects), or else among
// every object of the source, once (see settle).

// claim is one value that one object gives one key of a unique index.
type claim struct {
	object, value string
	created       int64
}

// older reports whether a was created before b: by creation time, then
// by object key (see keyBefore), which orders any two objects the same way on every
// replica, after every restart. An object whose creation time is not
// known (0) ranks after every one whose time is known: it cannot take a
// key from an object that is known to be older.
func older(a, b claim) bool {
	if ra, rb := rank(a.created), rank(b.created); ra != rb {
		return ra < rb
	}
	return keyBefore(a.object, b.object)
}

// keyBefore orders object keys by their part before the first ':', then
// by the rest: a writer that keeps several parts of a source under
// prefixes ("east:", "east2:"; see Source.ReplaceWithin) has them ordered
// by the prefix itself, which a plain comparison would not do ('2' sorts
// before ':'). Keys without ':' compare as strings.
func keyBefore(a, b string) bool {
	pa, ra, _ := strings.Cut(a, ":")
	pb, rb, _ := strings.Cut(b, ":")
	if pa != pb {
		return pa < pb
	}
	return ra < rb
}

func rank(created int64) int64 {
	if created <= 0 {
		return math.MaxInt64
	}
	return created
}

// createdOf reads the creation time of an encoding (see encodeMeta).
func createdOf(enc string) int64 {
	c, _ := uvarint(enc)
	return int64(c)
}

// claimsDiff records, for a unique index, an object's change of entries
// as changes of its claims: removed entries withdraw claims, added ones
// make claims. An object whose creation time changed (deleted and made
// anew between two reads) withdraws and makes every claim again.
func (t *Txn) claimsDiff(i int, object string, createdBefore, createdAfter int64, before, after []Entry) {
	renew := createdBefore != createdAfter
	a, b := 0, 0
	for a < len(before) || b < len(after) {
		switch {
		case b == len(after) || (a < len(before) && compareEntry(before[a], after[b]) < 0):
			t.claimRem(i, object, before[a])
			a++
		case a == len(before) || compareEntry(before[a], after[b]) > 0:
			t.claimAdd(i, object, after[b], createdAfter)
			b++
		default:
			if renew {
				t.claimRem(i, object, before[a])
				t.claimAdd(i, object, after[b], createdAfter)
			}
			a++
			b++
		}
	}
}

// maxSingles bounds, per unique index, the keys back to one value whose
// claims are kept (see settle): beyond it, half of them are dropped, in
// no order, and such a key is looked up again if it is claimed again.
var maxSingles = 1024 // a variable for tests

// claimChange is a claim made (add) or withdrawn.
type claimChange struct {
	claim
	add bool
}

func (t *Txn) claimRem(i int, object string, e Entry) {
	w := t.workFor(i, e.Key)
	w.claims = append(w.claims, claimChange{claim: claim{object: object, value: e.Value}})
}

func (t *Txn) claimAdd(i int, object string, e Entry, created int64) {
	w := t.workFor(i, e.Key)
	w.claims = append(w.claims, claimChange{claim: claim{object: object, value: e.Value, created: created}, add: true})
}

// settle brings the claims of the source's i-th index, a unique one, up
// to date with a transaction's work on it, and returns the index's chosen
// answers after it (chosen itself when none changed); under src.mu. raw
// gives each key of work its values after the transaction, and objectsOf
// (nil: the source keeps no object keys per index key) its objects.
func (src *Source) settle(i int, work map[string]*work, raw func(key string) []string, objectsOf func(key string) []string, chosen *choices) *choices {
	claims, singles := src.claims[i], src.singles[i]
	var missing map[string]bool
	for key, w := range work {
		n := len(raw(key))
		cl, ok := claims[key]
		switch {
		case n == 0:
			delete(claims, key)
			delete(singles, key)
			continue
		case !ok && n > 1:
			// A key that had one value at most has no claims: find them,
			// among the objects its values name when they are all there
			// (see claimsByName), else among every object.
			if objectsOf != nil {
				claims[key] = src.claimsOf(i, key, objectsOf(key))
				continue
			}
			if cl, all := src.claimsByName(i, key, raw(key)); all {
				claims[key] = cl
				continue
			}
			if missing == nil {
				missing = map[string]bool{}
			}
			missing[key] = true
			continue
		case !ok:
			continue
		}
		// In order: one object may withdraw a claim and make it again
		// (or the reverse) in one transaction.
		for _, ch := range w.claims {
			if ch.add {
				cl = append(cl, claim{object: strings.Clone(ch.object), value: strings.Clone(ch.value), created: ch.created})
			} else if j := slices.IndexFunc(cl, func(c claim) bool { return c.object == ch.object && c.value == ch.value }); j >= 0 {
				cl = slices.Delete(cl, j, j+1)
			}
		}
		claims[key] = cl
		// A key back to one value keeps its claims, kept up to date, so
		// that a claimant going back and forth costs no read of every
		// object each time it comes back; at most maxSingles such keys.
		if n == 1 {
			singles[key] = struct{}{}
		} else {
			delete(singles, key)
		}
	}
	if len(singles) > maxSingles {
		for key := range singles {
			delete(claims, key)
			delete(singles, key)
			if len(singles) <= maxSingles/2 {
				break
			}
		}
	}
	if missing != nil {
		found := src.findClaims(i, missing)
		for key := range missing {
			claims[key] = found[key]
		}
	}
	out := choicesWriter{hs: src.s.seed, was: chosen} // chosen is published: it changes a copy
	hooked := src.s.onConflict.Load() != nil
	for key := range work {
		c := choose(claims[key], raw(key))
		was, had := chosen.get(src.s.seed, key)
		if c.values == nil && !had || c.values != nil && had && c.object == was.object && slices.Equal(c.values, was.values) && slices.Equal(c.raw, was.raw) {
			continue
		}
		if c.values == nil {
			out.remove(key)
		} else {
			out.set(key, c)
			if hooked {
				src.notes = append(src.notes, note(src.s.handle(src.indexes[i]), key, claims[key], c.values))
			}
		}
	}
	return out.result()
}

// ConflictNote tells of a key of a unique index that a commit put in
// conflict, or whose answer in conflict it changed: the claimant answered
// and one that is not.
type ConflictNote struct {
	Index         Index
	Key           string
	Chosen, Other Claim
}

// OnConflict sets f, which hears each ConflictNote once the commit that
// made it is published; under the writer lock of the source that made
// it (not the store's: notes of different sources may come in any order,
// and at once): f must be quick, safe for concurrent use, and must not
// write to the store. Set it before the first write.
func (s *Store) OnConflict(f func(ConflictNote)) {
	if f == nil {
		s.onConflict.Store(nil)
		return
	}
	s.onConflict.Store(&f)
}

// note builds the ConflictNote of a key whose chosen values are chosen.
func note(ix Index, key string, claims []claim, chosen []string) ConflictNote {
	n := ConflictNote{Index: ix, Key: key}
	first := claims[0]
	for _, c := range claims[1:] {
		if older(c, first) {
			first = c
		}
	}
	n.Chosen = Claim{Object: first.object, Meta: Meta{Created: first.created}, Values: chosen, Chosen: true}
	for _, c := range claims {
		if c.object != first.object && !slices.Contains(chosen, c.value) {
			if n.Other.Object == "" || older(c, claim{object: n.Other.Object, created: n.Other.Meta.Created}) {
				n.Other = Claim{Object: c.object, Meta: Meta{Created: c.created}, Values: []string{c.value}}
			}
		}
	}
	return n
}

// tellConflicts passes the notes of a commit to the OnConflict function;
// under src.mu, after publish.
func (src *Source) tellConflicts() {
	if f := src.s.onConflict.Load(); f != nil {
		for _, n := range src.notes {
			(*f)(n)
		}
	}
	src.notes = src.notes[:0]
}

// findClaims returns the claims on the given keys of the source's i-th
// index, from every object of the source; under src.mu. It reads every
// object: it runs when a key of a unique index gains a second value, and
// when an index becomes unique.
func (src *Source) findClaims(i int, keys map[string]bool) map[string][]claim {
	out := make(map[string][]claim, len(keys))
	if len(keys) == 0 {
		return out
	}
	src.scans++
	// The keys of out are those of keys: the entries' are parts of records.
	own := make(map[string]string, len(keys))
	for k := range keys {
		own[k] = k
	}
	buf := make([][]Entry, len(src.indexes))
	var room []byte // the keys decodeIn rebuilds, for the whole scan
	for object, enc := range src.objects.All() {
		es := decodeIn(buf, enc, object, &room)[i]
		var created int64
		read := false
		for _, e := range es {
			if !keys[e.Key] {
				continue
			}
			if !read {
				created, read = createdOf(enc), true
			}
			key := own[e.Key]
			out[key] = append(out[key], claim{object: strings.Clone(object), value: strings.Clone(e.Value), created: created})
		}
	}
	return out
}

// choose returns what a key of a unique index answers when its claims
// disagree: the oldest claimant's values, as strings of raw (the key's
// values, sorted); no values when they agree, that is, when the oldest
// claimant gives every value of raw.
func choose(claims []claim, raw []string) choice {
	if len(claims) == 0 || len(raw) <= 1 {
		return choice{}
	}
	first := claims[0]
	for _, c := range claims[1:] {
		if older(c, first) {
			first = c
		}
	}
	var out []string
	for _, c := range claims {
		if c.object != first.object {
			continue
		}
		if j, ok := slices.BinarySearch(raw, c.value); ok && !slices.Contains(out, raw[j]) {
			out = append(out, raw[j])
		}
	}
	if len(out) == len(raw) {
		return choice{}
	}
	sort.Strings(out)
	return choice{values: slices.Clip(out), object: first.object, raw: raw}
}

// chooseAll computes the claims and chosen answers of the source's i-th
// index from scratch, from every object, for is, whose table holds every
// claimant's values (as any index's), and writes the chosen ones into the
// table. Under src.mu.
func (src *Source) chooseAll(i int, is *indexSnap) {
	multi := map[string]bool{}
	is.values.all(func(key string, values []string) {
		if len(values) > 1 {
			multi[key] = true
		}
	})
	claims := src.findClaims(i, multi)
	src.claims[i], src.singles[i] = claims, map[string]struct{}{}
	chosen := choicesWriter{hs: src.s.seed}
	for key, cl := range claims {
		if c := choose(cl, is.values.lookup(src.s.seed, key)); c.values != nil {
			chosen.set(key, c)
			if src.s.onConflict.Load() != nil {
				src.notes = append(src.notes, note(src.s.handle(src.indexes[i]), key, cl, c.values))
			}
		}
	}
	is.chosen = chosen.result()
	if is.chosen.count() > 0 {
		changes := make([]change, 0, is.chosen.count())
		for key, c := range is.chosen.all() {
			changes = append(changes, change{hash: src.s.hash(key), key: key, values: c.values})
		}
		is.values, _ = is.values.update(src.s.seed, changes)
	}
}

// unchoose puts back into is's table the values of every claimant of its
// keys in conflict, for an index that stops being unique.
func (is *indexSnap) unchoose(s *Store) {
	if is.chosen.count() > 0 {
		changes := make([]change, 0, is.chosen.count())
		for key, c := range is.chosen.all() {
			changes = append(changes, change{hash: s.hash(key), key: key, values: c.raw})
		}
		is.values, _ = is.values.update(s.seed, changes)
	}
	is.chosen = nil
}

// ConflictCount returns how many keys of ix are in conflict: claimed
// with different values by several objects of a unique index.
func (snap *Snapshot) ConflictCount(ix Index) int { return snap.index(ix).chosen.count() }

// Conflicts returns the keys of ix in conflict, sorted.
func (snap *Snapshot) Conflicts(ix Index) []string {
	keys := snap.index(ix).chosen.keys()
	sort.Strings(keys)
	return keys
}
