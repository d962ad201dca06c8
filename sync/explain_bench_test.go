package sync

import (
	"fmt"
	"strconv"
	"testing"
)

// BenchmarkExplainWideKey: the explanation of one key of 20,000 values
// (a Service of 200 EndpointSlices of 100 addresses each), which lists
// every object's values and which of them the answer holds.
func BenchmarkExplainWideKey(b *testing.B) {
	e, f := routingEngine(b)
	for i := range 200 {
		addrs := make([]string, 100)
		for j := range addrs {
			addrs[j] = fmt.Sprintf("10.%d.%d.%d", i/256, i%256, j)
		}
		must(b, f.Apply("slices", sliceJSON("s"+strconv.Itoa(i), "a", addrs...)))
	}
	b.ResetTimer()
	for b.Loop() {
		x := e.Explain(Target{Index: "app-to-addresses", Key: "a"})
		if n := len(x.Answer.Values); n != 20000 {
			b.Fatalf("%d values", n)
		}
	}
}
