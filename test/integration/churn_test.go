package integration_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"

	"github.com/iidp/metasync/test/testenv"
)

// envInt reads a number from the environment, or def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// endpoints returns n ready endpoints of a slice in a rollout generation:
// the first cut of them from gen, the rest from gen-1 (a rolling restart
// replaces pods a few at a time).
func endpoints(slice, gen, cut, n int) []discoveryv1.Endpoint {
	ready := true
	eps := make([]discoveryv1.Endpoint, n)
	for j := range eps {
		g := gen
		if j >= cut {
			g = gen - 1
		}
		eps[j] = discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", g%250, slice%250, j%250)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		}
	}
	return eps
}

// liveHeap returns the live heap after full collections.
func liveHeap() uint64 {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// heldBy runs an engine for cfg until synced, lets work run, and returns
// the live heap that the engine holds: with it, less without it.
func heldBy(t *testing.T, cfg *mschema.Config, work func(*msync.Engine)) uint64 {
	t.Helper()
	plan, err := mschema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e, err := msync.New(plan, env.Config, msync.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Start(ctx) }()
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	work(e)
	with := liveHeap()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e = nil
	without := liveHeap()
	if without > with {
		return 0
	}
	return with - without
}

// TestMemoryUnderRollingRestarts: EndpointSlices whose pods are restarted
// again and again (every address replaced, a quarter at a time) leave the
// engine holding what an engine started afresh on the same slices holds.
// METASYNC_CHURN_SLICES, METASYNC_CHURN_RESTARTS and METASYNC_CHURN_STEPS
// (updates of each slice per restart) size it; RELIABILITY.md has the
// figures of larger runs.
func TestMemoryUnderRollingRestarts(t *testing.T) {
	testenv.Need(t, env)
	slices := envInt("METASYNC_CHURN_SLICES", 40)
	restarts := envInt("METASYNC_CHURN_RESTARTS", 4)
	steps := envInt("METASYNC_CHURN_STEPS", 4) // updates of each slice per restart
	const perSlice = 100
	ns := "churn"
	env.Namespace(t, ns)
	ctx := context.Background()
	client := env.Kube.DiscoveryV1().EndpointSlices(ns)
	for i := range slices {
		_, err := client.Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("svc-%03d-abcde", i), Labels: map[string]string{"kubernetes.io/service-name": fmt.Sprintf("svc-%03d", i)}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   endpoints(i, 0, perSlice, perSlice),
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	cfg := &mschema.Config{Resources: []mschema.Resource{{
		Name: "endpointslices", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices",
		Namespace: ns, LabelSelector: "kubernetes.io/service-name",
		Indexes: []mschema.Index{{
			Name:  "service-to-addresses",
			Key:   `metadata.labels.kubernetes\.io/service-name`,
			Value: "endpoints.#(conditions.ready==true)#.addresses|@flatten",
		}},
	}}}
	last := fmt.Sprintf("10.%d.%d.%d", restarts%250, (slices-1)%250, (perSlice-1)%250)
	churned := heldBy(t, cfg, func(e *msync.Engine) {
		for gen := 1; gen <= restarts; gen++ {
			for step := 1; step <= steps; step++ {
				for i := range slices {
					s, err := client.Get(ctx, fmt.Sprintf("svc-%03d-abcde", i), metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					s.Endpoints = endpoints(i, gen, perSlice*step/steps, perSlice)
					if _, err := client.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		testenv.Eventually(t, "the last address of the last rollout", func() string {
			vs := e.Lookup("service-to-addresses", fmt.Sprintf("svc-%03d", slices-1))
			if len(vs) == perSlice && vs[len(vs)-1] == last {
				return ""
			}
			return fmt.Sprint(len(vs), " addresses")
		})
	})
	fresh := heldBy(t, cfg, func(e *msync.Engine) {
		if vs := e.Lookup("service-to-addresses", fmt.Sprintf("svc-%03d", slices-1)); len(vs) != perSlice || vs[len(vs)-1] != last {
			t.Fatalf("a fresh engine does not see the last rollout: %d addresses", len(vs))
		}
	})
	ratio := float64(churned) / float64(max(fresh, 1))
	t.Logf("%d EndpointSlices x %d addresses, %d rolling restarts in %d updates each: engine holds %d KiB, a fresh engine %d KiB: %.2fx",
		slices, perSlice, restarts, steps, churned>>10, fresh>>10, ratio)
	// The indexer's own test holds the factor to 1.2; the process around
	// the engine (client-go, the test) adds noise of its own here.
	if ratio > 1.5 {
		t.Errorf("after rolling restarts the engine holds %.2fx what a fresh engine holds, want about 1x", ratio)
	}
}
