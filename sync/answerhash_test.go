package sync

import (
	"context"
	"slices"
	"testing"
)

// TestResumeTellsAnswersApart: a resume sends nothing only when the
// answer is the one the subscriber holds. Values are chosen by whoever
// writes the objects: answers that differ only in how their bytes split
// into values (["a\x00b"] and ["a", "b"]) must not digest alike, and the
// digest is seeded, so that no answer can be made to pass for another.
func TestResumeTellsAnswersApart(t *testing.T) {
	e, f := routingEngine(t)
	must(t, f.Apply("slices", sliceJSON("s1", "x", "a\x00b")))
	target := KeyOf("app-to-addresses", "x")
	sub, err := e.Subscribe(context.Background(), target)
	must(t, err)
	first := next(t, sub)
	if first.Type != EventSnapshot || !slices.Equal(first.Values, []string{"a\x00b"}) {
		t.Fatalf("first event %+v", first)
	}
	sub.Close()

	must(t, f.Apply("slices", sliceJSON("s1", "x", "a", "b")))
	target.Resume = first.Version
	sub, err = e.Subscribe(context.Background(), target)
	must(t, err)
	defer sub.Close()
	ev := next(t, sub)
	if ev.Type != EventUpdate || !slices.Equal(ev.Values, []string{"a", "b"}) {
		t.Fatalf("resume from %q sent %+v, want the update to [a b]", first.Values, ev)
	}
}

// TestAnswerHashIsSeeded: the digest of an answer depends on a secret
// drawn per process, not on the values alone.
func TestAnswerHashIsSeeded(t *testing.T) {
	values := []string{"10.0.0.5", "10.0.0.6"}
	if answerHash(values) != answerHash(slices.Clone(values)) {
		t.Fatal("the digest of one answer differs between calls")
	}
	saved := answerSeed
	defer func() { answerSeed = saved }()
	seen := map[string]bool{}
	for range 8 {
		answerSeed = newAnswerSeed()
		seen[answerHash(values)] = true
	}
	if len(seen) < 2 {
		t.Fatal("the digest of an answer is the same under every seed")
	}
}
