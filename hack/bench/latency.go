// Write -> visible latency: from a server-side apply until a watcher sees
// the new model in its index, or a subscriber is told of it.

package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/client-go/dynamic"
)

// percentiles are the p50 and p99 of a latency, in milliseconds.
type percentiles struct{ p50, p99 float64 }

// probe is one observer of the timed writes.
type probe struct {
	// prepare, when not nil, runs before each write, before its clock
	// starts: a subscriber subscribes to the model about to be written.
	prepare func(model string) error
	// seen reports whether the observer has seen the model, and when.
	seen func(model string) (time.Time, bool)
	// done, when not nil, runs once every probe has seen the write.
	done func(model string)
}

// polled is a probe that polls visible: it sees a write when a poll finds
// it.
func polled(visible func(model string) bool) probe {
	return probe{seen: func(m string) (time.Time, bool) {
		if visible(m) {
			return time.Now(), true
		}
		return time.Time{}, false
	}}
}

// latency applies writes one after the other, each adding a new model to
// an existing AppModel, and times, for each visible function, from the
// PATCH until it returns true.
func latency(ctx context.Context, dyn dynamic.Interface, tag string, count int, visible ...func(model string) bool) ([]percentiles, error) {
	probes := make([]probe, len(visible))
	for j, v := range visible {
		probes[j] = polled(v)
	}
	ds, err := timeWrites(ctx, dyn, tag, count, probes...)
	if err != nil {
		return nil, err
	}
	return summarize(ds), nil
}

// timeWrites applies writes one after the other, each adding a new model
// to an existing AppModel, and returns, for each probe, the milliseconds
// from each write's PATCH until the probe saw it, in the order of the
// writes. The probes are polled every 50 µs; one that records its own
// time (a subscriber) is not held to the poll's.
func timeWrites(ctx context.Context, dyn dynamic.Interface, tag string, count int, probes ...probe) ([][]float64, error) {
	ds := make([][]float64, len(probes))
	for w := range count {
		i := (w * 7919) % *n
		m := fmt.Sprintf("%s-%d", tag, w)
		for _, p := range probes {
			if p.prepare != nil {
				if err := p.prepare(m); err != nil {
					return nil, fmt.Errorf("before %s: %w", m, err)
				}
			}
		}
		start := time.Now()
		if err := applyApp(ctx, dyn, i, m); err != nil {
			return nil, err
		}
		deadline := start.Add(30 * time.Second)
		seen := make([]bool, len(probes))
		for left := len(probes); left > 0; {
			for j, p := range probes {
				if seen[j] {
					continue
				}
				if at, ok := p.seen(m); ok {
					seen[j] = true
					left--
					ds[j] = append(ds[j], float64(at.Sub(start).Microseconds())/1000)
				}
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%s never became visible", m)
			}
			time.Sleep(50 * time.Microsecond)
		}
		for _, p := range probes {
			if p.done != nil {
				p.done(m)
			}
		}
	}
	return ds, nil
}

// summarize returns the p50 and p99 of each row of ds, leaving ds in its
// order.
func summarize(ds [][]float64) []percentiles {
	out := make([]percentiles, len(ds))
	for j, d := range ds {
		out[j] = pct(d)
	}
	return out
}

// pct returns the p50 and p99 of d, leaving d in its order.
func pct(d []float64) percentiles {
	s := slices.Clone(d)
	slices.Sort(s)
	return percentiles{s[len(s)/2], s[(len(s)*99)/100]}
}
