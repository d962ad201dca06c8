package metasynctest_test

import (
	"slices"
	"strconv"
	"testing"

	"github.com/iidp/metasync/metasynctest"
)

// TestEndpointSliceRules: a fake of the reference setup answers what the
// engine does on a cluster (test/integration's
// TestEndpointSliceSemantics): ready unset is ready, a service with no
// ready endpoint answers its serving terminating ones, IP:PORT from each
// slice's own port.
func TestEndpointSliceRules(t *testing.T) {
	fake, err := metasynctest.Load(appmodelConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.Apply("appmodels", `
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: base, namespace: meta-test, labels: {iidp: iidp}}
spec: {models: [model1]}
`); err != nil {
		t.Fatal(err)
	}
	slice := func(name string, port int, endpoints string) string {
		return `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ` + name + `, namespace: meta-test, labels: {kubernetes.io/service-name: base}}
addressType: IPv4
ports: [{name: http, port: ` + strconv.Itoa(port) + `}]
endpoints: ` + endpoints
	}
	if err := fake.Apply("endpointslices", slice("base-a", 8080, `[{addresses: [10.0.0.1]}, {addresses: [10.0.0.2], conditions: {ready: false}}]`)+"\n---\n"+
		slice("base-b", 9080, `[{addresses: [10.0.0.3], conditions: {}}]`)); err != nil {
		t.Fatal(err)
	}
	check := func(chain string, want ...string) {
		t.Helper()
		if got := fake.Resolve(chain, "model1"); !slices.Equal(got, want) {
			t.Errorf("%s model1 = %q, want %q", chain, got, want)
		}
	}
	check("model-to-addresses", "10.0.0.1", "10.0.0.3")
	check("model-to-endpoints", "10.0.0.1:8080", "10.0.0.3:9080")
	// Every endpoint terminating: the serving ones still answer.
	if err := fake.Replace("endpointslices", slice("base-a", 8080, `[{addresses: [10.0.0.1], conditions: {ready: false, serving: true, terminating: true}}, {addresses: [10.0.0.2], conditions: {ready: false, serving: false, terminating: true}}]`)); err != nil {
		t.Fatal(err)
	}
	check("model-to-addresses", "10.0.0.1")
	check("model-to-endpoints", "10.0.0.1:8080")
}
