package indexer

import (
	"maps"
	"reflect"
	"testing"
)

func TestExportGivesBackWhatWasWritten(t *testing.T) {
	s, err := New(SourceSpec{Name: "src", Indexes: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	src := s.Source("src")
	tx := src.Begin()
	tx.Put(Object{Key: "o1", Payload: "p1", Entries: [][]Entry{{{"k2", "o1"}, {"k1", "o1"}, {"k1", "o1"}}, {{"x", "v"}}}})
	tx.Put(Object{Key: "o2", Entries: [][]Entry{nil, {{"x", "w"}}}})
	tx.Put(Object{Key: "o3", Entries: [][]Entry{{{"k", "o3"}}}})
	tx.Commit()
	tx = src.Begin()
	tx.Delete("o3")
	tx.Commit()

	type got struct {
		entries [][]Entry
		payload any
	}
	out := map[string]got{}
	n := src.Export(func(key string, entries [][]Entry, payload any) {
		out[key] = got{norm(entries), payload} // entries are f's only until it returns
	})
	want := map[string]got{
		"o1": {[][]Entry{{{"k1", "o1"}, {"k2", "o1"}}, {{"x", "v"}}}, "p1"},
		"o2": {[][]Entry{{}, {{"x", "w"}}}, nil},
	}
	if n != 2 || !maps.EqualFunc(out, want, func(a, b got) bool {
		return a.payload == b.payload && reflect.DeepEqual(norm(a.entries), norm(b.entries))
	}) {
		t.Errorf("Export = %d %v, want %v", n, out, want)
	}

	// What Export gives, written into a new store, answers the same.
	s2, _ := New(SourceSpec{Name: "src", Indexes: []string{"a", "b"}})
	var objs []Object
	src.Export(func(key string, entries [][]Entry, payload any) {
		objs = append(objs, Object{Key: key, Entries: norm(entries), Payload: payload})
	})
	s2.Source("src").Replace(objs)
	for _, q := range [][2]string{{"a", "k1"}, {"a", "k2"}, {"a", "k"}, {"b", "x"}} {
		if a, b := s.Lookup(q[0], q[1]), s2.Lookup(q[0], q[1]); !reflect.DeepEqual(a, b) {
			t.Errorf("%v: %v, restored %v", q, a, b)
		}
	}
	if p, _ := s2.Snapshot().Payload(s2.Source("src"), "o1"); p != "p1" {
		t.Errorf("restored payload %v", p)
	}

	if _, err := s.Reconfigure(nil, nil); err != nil {
		t.Fatal(err)
	}
	if n := src.Export(func(string, [][]Entry, any) { t.Error("a removed source exported an object") }); n != 0 {
		t.Errorf("a removed source exported %d objects", n)
	}
}

func norm(ess [][]Entry) [][]Entry {
	out := make([][]Entry, len(ess))
	for i, es := range ess {
		out[i] = append([]Entry{}, es...)
	}
	return out
}
