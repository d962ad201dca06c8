package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// TestMeasureFacades measures the facades of a daemon serving 1,000
// models (keys of chain model-to-endpoints), for BENCHMARKS.md: the
// memory of an open blocking query (1,000 of them, one per model, then
// 1,000 on one model), the size and allocation of one http_sd answer,
// and the time from an EndpointSlice write to a Consul client's blocking
// loop seeing it, beside the same for an HTTP change stream. The daemon
// runs with GOGC=5, so that its heap in use is about its live heap. It
// runs
// when METASYNC_MEASURE=1:
//
//	METASYNC_MEASURE=1 KUBEBUILDER_ASSETS=... go test -count=1 -run TestMeasureFacades -v ./cmd/metasync/
func TestMeasureFacades(t *testing.T) {
	if os.Getenv("METASYNC_MEASURE") == "" {
		t.Skip("a measure: METASYNC_MEASURE=1 runs it")
	}
	const keys = 1000
	ns := "measure-facades"
	// The daemon collects often: the heap in use is then about the live
	// heap, what the queries hold.
	t.Setenv("GOGC", "5")
	addr, consulAddr, _, _ := consulDaemon(t, ns, 2, "--consul-max-blocking-per-caller", "0", "--consul-max-blocking", "0")
	models := make([]string, keys)
	for i := range models {
		models[i] = fmt.Sprintf("m%04d", i)
	}
	manifest := fmt.Sprintf("apiVersion: iidp.com/v1\nkind: AppModel\nmetadata: {name: xds-app, namespace: %s, labels: {iidp: iidp}}\nspec: {type: model, version: '1', models: [%s]}\n", ns, strings.Join(models, ", "))
	objects := filepath.Join(t.TempDir(), "models.yaml")
	_ = os.WriteFile(objects, []byte(manifest), 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, objects); err != nil {
		t.Fatal(err)
	}
	var sd []byte
	testenv.Eventually(t, "1,000 target groups", func() string {
		a := getRaw(t, "GET", base(addr)+"/v1/sd/chains/model-to-endpoints")
		var groups []json.RawMessage
		if json.Unmarshal([]byte(a.raw), &groups) != nil || len(groups) != keys {
			return fmt.Sprint(a.code, len(groups))
		}
		sd = []byte(a.raw)
		return ""
	})
	num := func(sample string) float64 {
		v, _ := strconv.ParseFloat(metric(t, base(addr), sample), 64)
		return v
	}
	const n = 200
	before := num("go_memstats_alloc_bytes_total")
	for i := 0; i < n; i++ {
		getRaw(t, "GET", base(addr)+"/v1/sd/chains/model-to-endpoints")
	}
	perAnswer := (num("go_memstats_alloc_bytes_total") - before) / n
	t.Logf("http_sd answer at %d keys: %d bytes, %.0f bytes allocated per answer (mean of %d, the /metrics reads included)", keys, len(sd), perAnswer, n)

	// Blocking queries: 1,000 on 1,000 models, then 1,000 on one.
	inUse := func() float64 {
		time.Sleep(2 * time.Second)
		return num("go_memstats_heap_inuse_bytes") + num("go_memstats_stack_inuse_bytes")
	}
	client, _ := consulapi.NewClient(&consulapi.Config{Address: consulAddr, Transport: &http.Transport{MaxIdleConnsPerHost: 2 * keys, MaxConnsPerHost: 0}})
	_, meta, err := client.Health().Service("m0000", "", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	open := func(name func(i int) string) (float64, context.CancelFunc) {
		base0 := inUse()
		qctx, qcancel := context.WithCancel(ctx)
		for i := 0; i < keys; i++ {
			go func() {
				q := (&consulapi.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 10 * time.Minute}).WithContext(qctx)
				_, _, _ = client.Health().Service(name(i), "", true, q)
			}()
		}
		testenv.Eventually(t, "1,000 blocking queries wait", func() string {
			if got := num("metasync_consul_blocking_queries"); got != keys {
				return fmt.Sprint(got)
			}
			return ""
		})
		return (inUse() - base0) / keys, qcancel
	}
	perQuery, stop := open(func(i int) string { return models[i] })
	t.Logf("a blocking query on its own model (1,000 models followed): %.0f bytes (heap and stacks in use)", perQuery)
	stop()
	testenv.Eventually(t, "the queries end", func() string {
		if got := num("metasync_consul_blocking_queries"); got != 0 {
			return fmt.Sprint(got)
		}
		return ""
	})
	perShared, stop := open(func(int) string { return "m0000" })
	t.Logf("a blocking query on a model 1,000 queries share: %.0f bytes", perShared)
	stop()

	measureChangeToVisible(t, ctx, client, addr, ns)
}

// measureChangeToVisible: change → visible, for a Consul blocking loop
// (of client) and an HTTP change stream on one model of the daemon at
// addr; an EndpointSlice of ns has its port moved back and forth, 100
// times, and the time each change takes to reach both is logged.
func measureChangeToVisible(t *testing.T, ctx context.Context, client *consulapi.Client, addr, ns string) {
	seen := make(chan string, 64)
	go func() {
		index := uint64(0)
		for ctx.Err() == nil {
			q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: time.Minute}).WithContext(ctx)
			entries, m, err := client.Health().Service("m0001", "", true, q)
			if err != nil {
				continue
			}
			if index != 0 && m.LastIndex != index {
				seen <- "consul " + strings.Join(addrsOf(entries), ",")
			}
			index = m.LastIndex
		}
	}()
	req, _ := http.NewRequestWithContext(ctx, "GET", base(addr)+"/v1/chains/model-to-endpoints/keys/m0001?watch=true", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"update"`) {
				seen <- "stream"
			}
		}
	}()
	time.Sleep(time.Second)
	eps := env.Kube.DiscoveryV1().EndpointSlices(ns)
	var consulLat, streamLat []time.Duration
	const changes = 100
	for i := 0; i < changes; i++ {
		s, err := eps.Get(ctx, "xds-app-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p := int32(20000 + i%2)
		s.Ports[0].Port = &p
		if _, err := eps.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		written := time.Now()
		got := map[string]bool{}
		for len(got) < 2 {
			select {
			case what := <-seen:
				kind, _, _ := strings.Cut(what, " ")
				if got[kind] {
					continue
				}
				got[kind] = true
				if kind == "consul" {
					consulLat = append(consulLat, time.Since(written))
				} else {
					streamLat = append(streamLat, time.Since(written))
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("change %d: seen by %v only", i, got)
			}
		}
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		sorted := slices.Sorted(slices.Values(d))
		return sorted[int(float64(len(sorted)-1)*p)]
	}
	t.Logf("write → visible over %d changes: Consul blocking loop p50 %v p99 %v; HTTP change stream p50 %v p99 %v",
		changes, pct(consulLat, .5), pct(consulLat, .99), pct(streamLat, .5), pct(streamLat, .99))
}
