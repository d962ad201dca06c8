package follow

import (
	"testing"
)

// TestFailingSet: what fails now per index, through events, deletes and
// lists; the last failure of a list is the same at every list.
func TestFailingSet(t *testing.T) {
	var f FailingSet
	bad := []Failure{{Index: "ix", Err: "an object"}}
	f.Note("a", bad)
	f.Note("b", append(bad, Failure{Index: "other", Err: "too many"}))
	n, last := f.Counts()
	if n["ix"] != 2 || n["other"] != 1 || last["ix"].Object != "b" {
		t.Fatalf("after two events: %v %v", n, last)
	}
	f.Note("b", nil) // fixed
	n, last = f.Counts()
	if n["ix"] != 1 || n["other"] != 0 || last["ix"].Object != "a" || !f.Any() {
		t.Fatalf("after a fix: %v %v", n, last)
	}
	for i := 0; i < 50; i++ {
		f.Replace(map[string][]Failure{"c": bad, "a": bad, "b": bad})
		if _, last := f.Counts(); last["ix"].Object != "c" {
			t.Fatalf("list %d: last %v, want the greatest key, c", i, last["ix"])
		}
	}
	f.Replace(nil)
	if f.Any() {
		t.Fatal("a list without failures leaves some")
	}
}
