package sync

import "testing"

// TestHintedFor: the tag of a hint is after its last tab (a value may
// hold one), and names a KIND=NAME.
func TestHintedFor(t *testing.T) {
	for _, c := range []struct {
		hints, unanswered []string
		want              string
	}{
		{[]string{"a\tzone=x", "b\tzone=y"}, []string{"a"}, ": hinted for zone=x"},
		{[]string{"a\tb\tzone=x"}, []string{"a\tb"}, ": hinted for zone=x"},
		{[]string{"a\tnode=n1", "a\tzone=x", "a\tzone=x"}, []string{"a"}, ": hinted for node=n1, zone=x"},
		{[]string{"a\tnotatag"}, []string{"a"}, ""},
		{[]string{"a"}, []string{"a"}, ""},
		{nil, []string{"a"}, ""},
	} {
		if got := hintedFor(tagsByValue(c.hints), c.unanswered); got != c.want {
			t.Errorf("hintedFor(%q, %q) = %q, want %q", c.hints, c.unanswered, got, c.want)
		}
	}
}
