package grpcresolver

import (
	"context"
	gosync "sync"
)

// sink is what a source (a subscription, or a daemon's stream) delivers
// its answers and errors to: a follower, or one side of a homeFirst.
type sink interface {
	publish(values []string)
	fail(err error)
}

// homeFirst publishes to f, for a config that reads several clusters, the
// home cluster's part of an answer while it has values, else the whole
// answer: calls stay in the home cluster, and go to the other clusters by
// themselves when the home has no address to give (none ready, or its
// part dropped), as xDS clients do by priority. Two sources feed it: the
// home's part and the whole answer.
type homeFirst struct {
	f *follower

	mu            gosync.Mutex
	home, all     []string
	homeKnown, ok bool // ok: the whole answer is known
	published     []string
	any           bool // something was published
}

// side is one source of a homeFirst.
type side struct {
	h    *homeFirst
	home bool
}

func (s side) publish(values []string) { s.h.set(s.home, values) }
func (s side) fail(err error)          { s.h.f.fail(err) }

// set records one source's answer and publishes the choice when it
// changed. Until the whole answer is known, only a home part with values
// is published.
func (h *homeFirst) set(home bool, values []string) {
	h.mu.Lock()
	if home {
		h.home, h.homeKnown = values, true
	} else {
		h.all, h.ok = values, true
	}
	var choice []string
	switch {
	case h.homeKnown && len(h.home) > 0:
		choice = h.home
	case h.ok:
		choice = h.all
	default:
		h.mu.Unlock()
		return
	}
	if h.any && equal(choice, h.published) {
		h.mu.Unlock()
		return
	}
	h.published, h.any = choice, true
	h.mu.Unlock()
	h.f.publish(choice)
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// runHomeFirst runs follow for the home's part and for the whole answer
// at once, into a homeFirst of f, until ctx ends.
func runHomeFirst(ctx context.Context, f *follower, follow func(ctx context.Context, cluster string, s sink), home string) {
	h := &homeFirst{f: f}
	var wg gosync.WaitGroup
	wg.Go(func() { follow(ctx, home, side{h, true}) })
	follow(ctx, "", side{h, false})
	wg.Wait()
}
