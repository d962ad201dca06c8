package xds

import (
	"io"
	"log/slog"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
)

// TestHomePriorityOfAChain: with the AppModel in west alone and an
// endpoint of its app in each cluster, the home cluster's (east's)
// endpoint is priority 0 and west's priority 1. A chain's home part is
// narrowed by its last step only: the model is found in west, the
// endpoints of its app are the home's in east.
func TestHomePriorityOfAChain(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{
		Clusters: []schema.Cluster{{Name: "east", Home: true, Kubeconfig: "/nowhere/east"}, {Name: "west", Kubeconfig: "/nowhere/west"}},
		Resources: []schema.Resource{
			{Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
				Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}}},
			{Name: "endpointslices", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices",
				Indexes: []schema.Index{{Name: "service-to-endpoints", Key: `metadata.labels.kubernetes\.io/service-name`, Value: `@endpoints:{"port":"http"}`}}},
		},
		Chains: []schema.Chain{{Name: "model-to-endpoints", Indexes: []string{"model-to-app", "service-to-endpoints"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	slice := func(addr string) string {
		return `{"metadata":{"name":"shop-1","namespace":"ns","labels":{"kubernetes.io/service-name":"shop"}},` +
			`"ports":[{"name":"http","port":80}],"endpoints":[{"addresses":["` + addr + `"],"conditions":{"ready":true}}]}`
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(fake.In("west").Apply("appmodels", `{"metadata":{"name":"shop","namespace":"ns"},"spec":{"models":["m1"]}}`))
	must(fake.In("east").Apply("endpointslices", slice("10.1.0.1")))
	must(fake.In("west").Apply("endpointslices", slice("10.2.0.1")))

	s := adsClientOf(t, New(fake.Engine().Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil))
	rs := responses(s)
	name := "chains/model-to-endpoints/m1"
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	r := recv(rs, 5*time.Second)
	if r == nil {
		t.Fatal("no assignment")
	}
	cla := &endpointv3.ClusterLoadAssignment{}
	if err := r.GetResources()[0].UnmarshalTo(cla); err != nil {
		t.Fatal(err)
	}
	got := map[uint32][]string{}
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			got[l.GetPriority()] = append(got[l.GetPriority()], e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
		}
	}
	if len(got) != 2 || len(got[0]) != 1 || got[0][0] != "10.1.0.1" || len(got[1]) != 1 || got[1][0] != "10.2.0.1" {
		t.Errorf("priorities %v, want east's 10.1.0.1 at 0, west's 10.2.0.1 at 1", got)
	}
}
