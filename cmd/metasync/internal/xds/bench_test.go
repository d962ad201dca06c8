package xds

import (
	"fmt"
	"runtime"
	"sort"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// BenchmarkPush: a write to the engine until each of 1 or 50 raw ADS
// clients (in this process, each on its own connection), subscribed to
// the target's assignment, has received the new one and ACKed it.
// Reported: ns per write to the last client, and its p99 over the run
// ("p99-ns/write"); the same write's time until the engine answers it
// ("visible-ns/write", the write itself: the feed applies it before it
// returns); memory per connected client ("B/client": heap in use after
// the clients connected and got their first assignment, over their
// number).
func BenchmarkPush(b *testing.B) {
	for _, clients := range []int{1, 50} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) { benchPush(b, clients) })
	}
}

func benchPush(b *testing.B, clients int) {
	addrs := []string{"10.9.0.1:80", "10.9.0.2:80"}
	app := fmt.Sprintf("bench-app-%d", clients)
	model := fmt.Sprintf("bench-model-%d", clients)
	route(b, app, model, addrs...)
	name := "chains/model-to-endpoints/" + model
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	type conn struct {
		s  discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
		rs <-chan *discoveryv3.DiscoveryResponse
	}
	var cs []conn
	for i := 0; i < clients; i++ {
		s := adsClient(b)
		rs := responses(s)
		if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}}); err != nil {
			b.Fatal(err)
		}
		r := recv(rs, 5*time.Second)
		if r == nil {
			b.Fatal("no first assignment")
		}
		_ = s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}, ResponseNonce: r.GetNonce()})
		cs = append(cs, conn{s, rs})
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	perClient := (float64(after.HeapInuse) - float64(before.HeapInuse)) / float64(clients)
	lat := make([]time.Duration, 0, b.N)
	var visible time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		route(b, app, model, addrs[0], fmt.Sprintf("10.9.1.%d:80", i%250+1))
		visible += time.Since(start)
		for _, c := range cs {
			r := recv(c.rs, 10*time.Second)
			if r == nil {
				b.Fatal("a client got no push")
			}
			_ = c.s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}, ResponseNonce: r.GetNonce()})
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns/write")
	b.ReportMetric(perClient, "B/client")
	b.ReportMetric(float64(visible.Nanoseconds())/float64(b.N), "visible-ns/write")
}
