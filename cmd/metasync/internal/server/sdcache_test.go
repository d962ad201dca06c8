package server

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"
)

// sdSlice is an EndpointSlice of service with one ready endpoint at ip,
// port http 8080: a host:port value of index service-to-endpoints.
func sdSlice(name, service, ip string) []byte {
	return fmt.Appendf(nil, `{"metadata":{"name":%q,"namespace":"meta-test","labels":{"kubernetes.io/service-name":%q}},
"ports":[{"name":"http","port":8080}],"endpoints":[{"addresses":[%q],"conditions":{"ready":true}}]}`, name, service, ip)
}

func sdGet(t testing.TB, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return b
}

// TestSDAnswerKept: two scrapes of an unchanged state get the same
// bytes, the second from the cache (no read of the keys, no encoding);
// a change of the engine's state answers anew.
func TestSDAnswerKept(t *testing.T) {
	base, f, s := limitedServer(t, Limits{})
	if err := f.Apply("endpointslices", sdSlice("a", "model1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	for _, route := range []string{"indexes/service-to-endpoints", "chains/model-to-endpoints"} {
		url := base + "/v1/sd/" + route
		first := sdGet(t, url)
		kept := s.sdCache.m[route]
		if kept == nil {
			t.Fatalf("%s: no answer kept", route)
		}
		if second := sdGet(t, url); !bytes.Equal(first, second) || s.sdCache.m[route] != kept {
			t.Errorf("%s: a second scrape of the same state: %s (kept anew: %v), want %s from the cache", route, second, s.sdCache.m[route] != kept, first)
		}
	}
	url := base + "/v1/sd/indexes/service-to-endpoints"
	before := sdGet(t, url)
	if err := f.Apply("endpointslices", sdSlice("b", "model2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	after := sdGet(t, url)
	if bytes.Equal(before, after) || !bytes.Contains(after, []byte("10.0.0.2:8080")) {
		t.Errorf("after a change: %s, want model2's target too", after)
	}
}

// BenchmarkSDAnswer: one /v1/sd scrape of an index of 1,000 keys, its
// state unchanged between scrapes.
func BenchmarkSDAnswer(b *testing.B) {
	base, f, _ := limitedServer(b, Limits{})
	var objs [][]byte
	for i := range 1000 {
		objs = append(objs, sdSlice(fmt.Sprint("s", i), fmt.Sprint("model", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)))
	}
	if err := f.Apply("endpointslices", objs...); err != nil {
		b.Fatal(err)
	}
	url := base + "/v1/sd/indexes/service-to-endpoints"
	b.ReportAllocs()
	for b.Loop() {
		sdGet(b, url)
	}
}
