package integration_test

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"

	"github.com/iidp/metasync/test/testenv"
)

var gatewayGVR = schema.GroupVersionResource{Group: "net.iidp.com", Version: "v1alpha1", Resource: "gateways"}

// createGateway creates a Gateway of examples/custom-crd with routes
// routes, each with two hosts and a backend.
func createGateway(t *testing.T, ns, name string, routes int) {
	t.Helper()
	rs := make([]any, routes)
	for i := range rs {
		rs[i] = map[string]any{
			"name":    fmt.Sprintf("r%04d", i),
			"hosts":   []any{fmt.Sprintf("h%04d.%s.example.com", i, name), fmt.Sprintf("www.h%04d.%s.example.com", i, name)},
			"backend": fmt.Sprintf("svc-%04d", i),
		}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "net.iidp.com/v1alpha1", "kind": "Gateway",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"owner": "team", "priority": 1, "routes": rs},
	}}
	if _, err := env.Dynamic.Resource(gatewayGVR).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create %s/%s: %v", ns, name, err)
	}
}

// TestOneObjectCannotExhaustMemory: a Gateway with 800 routes under the
// custom-crd example's template key (namespace/host -> backend) would
// contribute 1,600 × 800 entries. It is over the per-object limit: it
// contributes nothing to that index and counts a rule error, the sync
// allocates little, its other indexes and the other objects are served.
func TestOneObjectCannotExhaustMemory(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "custom-crd", "crd.yaml"))
	ns := "hostile"
	env.Namespace(t, ns)
	createGateway(t, ns, "small", 2)
	createGateway(t, ns, "huge", 800)

	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	e := startEngine(t, &mschema.Config{Resources: []mschema.Resource{{
		Name: "gateways", Group: "net.iidp.com", Version: "v1alpha1", Resource: "gateways", Namespace: ns,
		Indexes: []mschema.Index{
			{Name: "host-to-gateway", Key: "spec.routes.#.hosts"},
			{Name: "namespaced-host-to-backend", Key: "${metadata.namespace}/${spec.routes.#.hosts}", Value: "spec.routes.#.backend"},
		},
	}}})
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	if got := e.Lookup("namespaced-host-to-backend", "hostile/h0001.small.example.com"); !slices.Equal(got, []string{"svc-0000", "svc-0001"}) {
		t.Errorf("the small gateway is not served: %q", got)
	}
	if got := e.Lookup("namespaced-host-to-backend", "hostile/h0001.huge.example.com"); got != nil {
		t.Errorf("the huge gateway contributed %d values to the index over its limit", len(got))
	}
	if got := e.Lookup("host-to-gateway", "h0799.huge.example.com"); !slices.Equal(got, []string{"hostile/huge"}) {
		t.Errorf("the huge gateway's index within the limit is not served: %q", got)
	}
	st := e.Status()[0]
	if st.RuleErrors["namespaced-host-to-backend"] != 1 || st.RuleErrors["host-to-gateway"] != 0 {
		t.Errorf("rule errors = %v, want 1 for namespaced-host-to-backend only", st.RuleErrors)
	}
	// The entries that the limit refuses would allocate hundreds of MiB.
	t.Logf("the sync of two gateways, one with 800 routes, allocated %.1f MiB", float64(after.TotalAlloc-before.TotalAlloc)/(1<<20))
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("the sync allocated %d MiB", alloc>>20)
	}

	// A watch event of such an object costs no more than the list did.
	runtime.ReadMemStats(&before)
	createGateway(t, ns, "huge2", 800)
	expect(t, e, "host-to-gateway", "h0799.huge2.example.com", "hostile/huge2")
	runtime.ReadMemStats(&after)
	t.Logf("a watch event of another gateway with 800 routes allocated %.1f MiB", float64(after.TotalAlloc-before.TotalAlloc)/(1<<20))
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("a watch event allocated %d MiB", alloc>>20)
	}
	if n := e.Status()[0].RuleErrors["namespaced-host-to-backend"]; n != 2 {
		t.Errorf("rule errors after the watch event = %d, want 2", n)
	}
}

// TestLongStringsCannotMultiply: the entry limit also bounds bytes. A
// Gateway whose owner is 100 KiB and that has 1,000 routes would write
// the owner once per host (2,000 × 100 KiB) under an index keyed by the
// owner, and a fields template of hosts × backends would build 2,000,000
// strings: both are refused, and the sync allocates little.
func TestLongStringsCannotMultiply(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "custom-crd", "crd.yaml"))
	ns := "hostile-bytes"
	env.Namespace(t, ns)
	rs := make([]any, 1000)
	for i := range rs {
		rs[i] = map[string]any{
			"name":    fmt.Sprintf("r%04d", i),
			"hosts":   []any{fmt.Sprintf("h%04d.example.com", i), fmt.Sprintf("www.h%04d.example.com", i)},
			"backend": fmt.Sprintf("svc-%04d", i),
		}
	}
	owner := strings.Repeat("o", 100<<10)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "net.iidp.com/v1alpha1", "kind": "Gateway",
		"metadata": map[string]any{"name": "long"},
		"spec":     map[string]any{"owner": owner, "priority": 1, "routes": rs},
	}}
	if _, err := env.Dynamic.Resource(gatewayGVR).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createGateway(t, ns, "small", 2)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	e := startEngine(t, &mschema.Config{Resources: []mschema.Resource{{
		Name: "gateways", Group: "net.iidp.com", Version: "v1alpha1", Resource: "gateways", Namespace: ns,
		Fields: map[string]string{"pairs": "${spec.routes.#.hosts}=${spec.routes.#.backend}", "priority": "spec.priority"},
		Indexes: []mschema.Index{
			{Name: "owner-to-host", Key: "spec.owner", Value: "spec.routes.#.hosts"},
			{Name: "host-to-gateway", Key: "spec.routes.#.hosts"},
		},
	}}})
	runtime.ReadMemStats(&after)
	t.Logf("the sync allocated %.1f MiB", float64(after.TotalAlloc-before.TotalAlloc)/(1<<20))
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("the sync allocated %d MiB", alloc>>20)
	}
	if got := e.Lookup("owner-to-host", owner); got != nil {
		t.Errorf("the long owner was indexed with %d hosts over the byte bound", len(got))
	}
	if got := e.Lookup("host-to-gateway", "h0999.example.com"); !slices.Equal(got, []string{ns + "/long"}) {
		t.Errorf("the gateway's index within its bounds is not served: %q", got)
	}
	if n := e.Status()[0].RuleErrors["owner-to-host"]; n != 1 {
		t.Errorf("rule errors of owner-to-host = %d, want 1", n)
	}
	type fields struct {
		Pairs    any `json:"pairs"`
		Priority int `json:"priority"`
	}
	f, found, err := msync.Object[fields](e, "gateways", ns+"/long")
	if err != nil || !found || f.Pairs != nil || f.Priority != 1 {
		t.Errorf("fields of the long gateway = %+v, %v, %v: want the template left out, the rest kept", f, found, err)
	}
}
