package indexer

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestPart: a part of a key's answer is what the accepted objects give
// it: the whole answer (its own slice) when every object behind the key
// is accepted, nothing when none is, and else the accepted objects'
// values, each once; of the fallback when the index has none of its own;
// of a unique key in conflict, only what of the chosen claimant's values
// the accepted objects give. A source with Parts tells a commit's keys
// whose givers changed while their values did not.
func TestPart(t *testing.T) {
	s, err := New(SourceSpec{Name: "eps", Indexes: []string{"ready", "serving", "owner"}, Parts: true,
		Fallbacks: map[string]string{"ready": "serving"}, Unique: []string{"owner"}})
	if err != nil {
		t.Fatal(err)
	}
	var told [][]string
	s.OnCommit(func(_, _ *Snapshot, changes []Change) {
		for _, c := range changes {
			keys := slices.Clone(c.Keys)
			slices.Sort(keys)
			told = append(told, keys)
		}
	})
	src := s.Source("eps")
	put := func(key string, meta Meta, ready, serving, owner []Entry) {
		tx := src.Begin()
		tx.Put(Object{Key: key, Meta: meta, Entries: [][]Entry{ready, serving, owner}})
		tx.Commit()
	}
	of := func(cluster string) func(string) bool {
		return func(o string) bool { return strings.HasPrefix(o, cluster+":") }
	}
	put("east:ns/a", Meta{Created: 1}, []Entry{e("shop", "10.0.0.1"), e("shop", "10.0.0.2")}, nil, []Entry{e("shop", "team-a")})
	put("west:ns/a", Meta{Created: 2}, []Entry{e("shop", "10.1.0.1")}, nil, []Entry{e("shop", "team-b")})
	put("west:ns/b", Meta{Created: 3}, []Entry{e("shop", "10.0.0.2")}, []Entry{e("cart", "10.1.0.9")}, nil)
	put("east:ns/c", Meta{Created: 4}, []Entry{e("solo", "10.0.0.7")}, nil, nil)

	snap := s.Snapshot()
	ready, _ := s.Index("ready")
	owner, _ := s.Index("owner")
	for _, c := range []struct {
		ix      Index
		key     string
		cluster string
		want    []string
	}{
		{ready, "shop", "east", []string{"10.0.0.1", "10.0.0.2"}},
		{ready, "shop", "west", []string{"10.0.0.2", "10.1.0.1"}},
		{ready, "shop", "south", nil},
		{ready, "solo", "east", []string{"10.0.0.7"}},
		{ready, "solo", "west", nil},
		{ready, "cart", "west", []string{"10.1.0.9"}}, // the fallback's
		{ready, "cart", "east", nil},
		{ready, "none", "east", nil},
		{owner, "shop", "east", []string{"team-a"}}, // the oldest claimant
		{owner, "shop", "west", nil},                // its claim is not answered
	} {
		if got := snap.Part(c.ix, c.key, of(c.cluster)); !slices.Equal(got, c.want) {
			t.Errorf("part of %q in %s's objects = %q, want %q", c.key, c.cluster, got, c.want)
		}
	}
	// The whole answer is the lookup's own slice: nothing allocated.
	whole := snap.Part(ready, "solo", of("east"))
	if lookup := snap.Lookup(ready, "solo"); &whole[0] != &lookup[0] {
		t.Error("a part that is the whole answer is a copy")
	}
	if n := testing.AllocsPerRun(100, func() { snap.Part(ready, "solo", of("east")) }); n > 1 {
		t.Errorf("a whole part allocates %v times", n)
	}

	// West's b stops giving 10.0.0.2, which east's a gives too: the
	// answer stays, west's part changes, and the commit tells "shop".
	told = nil
	put("west:ns/b", Meta{Created: 3}, nil, []Entry{e("cart", "10.1.0.9")}, nil)
	if got := s.Lookup("ready", "shop"); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2", "10.1.0.1"}) {
		t.Fatalf("answer = %q", got)
	}
	if got := s.Snapshot().Part(ready, "shop", of("west")); !slices.Equal(got, []string{"10.1.0.1"}) {
		t.Errorf("west's part after = %q", got)
	}
	if !slices.ContainsFunc(told, func(keys []string) bool { return slices.Equal(keys, []string{"shop"}) }) {
		t.Errorf("told %q, want shop's givers changed", told)
	}
	// And back: the same.
	told = nil
	put("west:ns/b", Meta{Created: 3}, []Entry{e("shop", "10.0.0.2")}, []Entry{e("cart", "10.1.0.9")}, nil)
	if !slices.ContainsFunc(told, func(keys []string) bool { return slices.Equal(keys, []string{"shop"}) }) {
		t.Errorf("told %q, want shop's givers changed", told)
	}
	if got := s.Snapshot().Part(ready, "shop", of("west")); !slices.Equal(got, []string{"10.0.0.2", "10.1.0.1"}) {
		t.Errorf("west's part back = %q", got)
	}

	// One transaction moves "solo"'s value from east's c to west's d:
	// the answer stays, its giver changes, and the commit tells it.
	told = nil
	tx := src.Begin()
	tx.Delete("east:ns/c")
	tx.Put(Object{Key: "west:ns/d", Meta: Meta{Created: 5}, Entries: [][]Entry{{e("solo", "10.0.0.7")}, nil, nil}})
	tx.Commit()
	if !slices.ContainsFunc(told, func(keys []string) bool { return slices.Contains(keys, "solo") }) {
		t.Errorf("told %q, want solo's givers changed", told)
	}
	if got := s.Snapshot().Part(ready, "solo", of("west")); !slices.Equal(got, []string{"10.0.0.7"}) {
		t.Errorf("west's part of solo = %q", got)
	}
}

// BenchmarkPart reads one cluster's part of a key that 3 objects of each
// of two clusters give, 100 values each (EndpointSlices of one service in
// both clusters): "whole", a key only the cluster gives; "mixed", a key
// both give, whose part decodes the cluster's 3 objects.
//
//	go test -run XXX -bench Part -benchmem ./indexer/
func BenchmarkPart(b *testing.B) {
	s, err := New(SourceSpec{Name: "eps", Indexes: []string{"ready"}, Parts: true})
	if err != nil {
		b.Fatal(err)
	}
	src := s.Source("eps")
	tx := src.Begin()
	for _, cluster := range []string{"east", "west"} {
		for o := range 3 {
			var es []Entry
			for v := range 100 {
				es = append(es, e("shop", cluster+"-"+strconv.Itoa(o)+"-"+strconv.Itoa(v)+":8080"))
				if cluster == "east" {
					es = append(es, e("solo", "10.9."+strconv.Itoa(o)+"."+strconv.Itoa(v)+":8080"))
				}
			}
			tx.Put(Object{Key: cluster + ":ns/shop-" + strconv.Itoa(o), Entries: [][]Entry{es}})
		}
	}
	tx.Commit()
	snap := s.Snapshot()
	ix, _ := s.Index("ready")
	east := func(o string) bool { return strings.HasPrefix(o, "east:") }
	for _, key := range []string{"solo", "shop"} {
		name := map[string]string{"solo": "whole", "shop": "mixed"}[key]
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if len(snap.Part(ix, key, east)) != 300 {
					b.Fatal("part")
				}
			}
		})
	}
}

// TestPartAfterLoad: a source with Parts, loaded from a saved image,
// answers each part of a key that objects of two parts give as soon as
// Load returns: it is built from its objects at once (its parts are
// read from them), not answered from the saved tables first.
func TestPartAfterLoad(t *testing.T) {
	spec := SourceSpec{Name: "eps", Indexes: []string{"ready"}, Parts: true}
	a, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	src := a.Source("eps")
	tx := src.Begin()
	tx.Put(Object{Key: "east:ns/a", Entries: [][]Entry{{e("shop", "10.0.0.1")}}})
	tx.Put(Object{Key: "west:ns/a", Entries: [][]Entry{{e("shop", "10.1.0.1")}}})
	tx.Commit()
	sv := save(src.Image())

	b, _ := New(spec)
	loaded := false
	done := b.Source("eps").Load(sv.strs, sv.indexes, sv.count, func(func(string, any)) {}, func() []Object {
		loaded = true
		out := make([]Object, len(sv.objs))
		for i, o := range sv.objs {
			out[i] = Object{Key: o.Key, Entries: norm(o.Entries)}
		}
		return out
	})
	if !loaded {
		t.Fatal("Load returned before it read the objects")
	}
	ready, _ := b.Index("ready")
	snap := b.Snapshot()
	of := func(c string) func(string) bool { return func(o string) bool { return strings.HasPrefix(o, c+":") } }
	if east, west := snap.Part(ready, "shop", of("east")), snap.Part(ready, "shop", of("west")); !slices.Equal(east, []string{"10.0.0.1"}) || !slices.Equal(west, []string{"10.1.0.1"}) {
		t.Errorf("parts once Load returned: east %q, west %q", east, west)
	}
	<-done
}
