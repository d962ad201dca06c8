package main

import (
	"slices"
	"testing"

	"github.com/iidp/metasync/metasynctest"
)

// TestRoutes is the kind of unit test a user writes for code that reads
// metasync: the real config, objects as YAML, no cluster.
func TestRoutes(t *testing.T) {
	fake, err := metasynctest.Load("config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(fake.Apply("appmodels", `
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: iiot, namespace: meta-test, labels: {iidp: iidp}}
spec: {type: model, version: 2.8.2, models: [iiot_dataservice, iiot_edge_project]}
---
# Without the label that config.yaml selects: not seen.
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: stray, namespace: meta-test}
spec: {type: model, version: "1", models: [iiot_dataservice]}
`))
	must(fake.Apply("endpointslices", `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: iiot-abc
  namespace: meta-test
  labels: {kubernetes.io/service-name: iiot}
addressType: IPv4
endpoints:
- addresses: [10.0.3.10]
  conditions: {ready: true}
- addresses: [10.0.3.11]
  conditions: {ready: false}
`))

	got, err := routes(fake, "iiot_dataservice")
	must(err)
	if len(got) != 1 || got[0].App.Name != "iiot" || got[0].App.Version != "2.8.2" || !slices.Equal(got[0].Addresses, []string{"10.0.3.10"}) {
		t.Fatalf("routes = %+v, want app iiot 2.8.2 at 10.0.3.10 only", got)
	}

	// The pod becomes ready; then the app drops the model.
	must(fake.Apply("endpointslices", `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: iiot-abc, namespace: meta-test, labels: {kubernetes.io/service-name: iiot}}
endpoints:
- {addresses: [10.0.3.10], conditions: {ready: true}}
- {addresses: [10.0.3.11], conditions: {ready: true}}
`))
	got, err = routes(fake, "iiot_dataservice")
	must(err)
	if len(got) != 1 || !slices.Equal(got[0].Addresses, []string{"10.0.3.10", "10.0.3.11"}) {
		t.Fatalf("after the pod is ready: %+v", got)
	}
	must(fake.Apply("appmodels", `{"metadata":{"name":"iiot","namespace":"meta-test","labels":{"iidp":"iidp"}},"spec":{"models":["iiot_edge_project"]}}`))
	if got, _ := routes(fake, "iiot_dataservice"); len(got) != 0 {
		t.Fatalf("after the model was dropped: %+v", got)
	}
	must(fake.Delete("appmodels", "meta-test/iiot"))
	if got, _ := routes(fake, "iiot_edge_project"); len(got) != 0 {
		t.Fatalf("after the delete: %+v", got)
	}
}
