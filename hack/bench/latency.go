// Write -> visible latency: from a server-side apply until a watcher sees
// the new model in its index.

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

// latency applies writes one after the other, each adding a new model to
// an existing AppModel, and times, for each visible function, from the
// PATCH until it returns true.
func latency(ctx context.Context, dyn dynamic.Interface, tag string, count int, visible ...func(model string) bool) ([]percentiles, error) {
	ds := make([][]float64, len(visible))
	for w := range count {
		i := (w * 7919) % *n
		m := fmt.Sprintf("%s-%d", tag, w)
		start := time.Now()
		if err := applyApp(ctx, dyn, i, m); err != nil {
			return nil, err
		}
		deadline := start.Add(30 * time.Second)
		seen := make([]bool, len(visible))
		for left := len(visible); left > 0; {
			for j, v := range visible {
				if !seen[j] && v(m) {
					seen[j] = true
					left--
					ds[j] = append(ds[j], float64(time.Since(start).Microseconds())/1000)
				}
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%s never became visible", m)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	out := make([]percentiles, len(visible))
	for j, d := range ds {
		slices.Sort(d)
		out[j] = percentiles{d[len(d)/2], d[(len(d)*99)/100]}
	}
	return out, nil
}
