package sync

import "testing"

// TestFailingSet: what fails now per index, through events, deletes and
// lists; the last failure of a list is the same at every list.
func TestFailingSet(t *testing.T) {
	var f failingSet
	bad := []ruleFailure{{index: "ix", err: "an object"}}
	f.note("a", bad)
	f.note("b", append(bad, ruleFailure{index: "other", err: "too many"}))
	n, last := f.counts()
	if n["ix"] != 2 || n["other"] != 1 || last["ix"].Object != "b" {
		t.Fatalf("after two events: %v %v", n, last)
	}
	f.note("b", nil) // fixed
	n, last = f.counts()
	if n["ix"] != 1 || n["other"] != 0 || last["ix"].Object != "a" || !f.any() {
		t.Fatalf("after a fix: %v %v", n, last)
	}
	for i := 0; i < 50; i++ {
		f.replace(map[string][]ruleFailure{"c": bad, "a": bad, "b": bad})
		if _, last := f.counts(); last["ix"].Object != "c" {
			t.Fatalf("list %d: last %v, want the greatest key, c", i, last["ix"])
		}
	}
	f.replace(nil)
	if f.any() {
		t.Fatal("a list without failures leaves some")
	}
}
