package xds

import (
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// TestAssignmentFromOneState: a client in a zone, on a service without
// hints, gets one locality in every assignment, whatever the writes:
// the zone's answer and the whole answer are read from one state, never
// an old zone's answer beside a new whole one.
func TestAssignmentFromOneState(t *testing.T) {
	name := "chains/model-to-endpoints/state-model"
	addrs := []string{"10.8.0.1:80"}
	route(t, "state-app", "state-model", addrs...)
	s := adsClient(t)
	rs := responses(s)
	node := &corev3.Node{Id: "zoned", Locality: &corev3.Locality{Zone: "z1"}}
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeEndpoint, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	check := func(r *discoveryv3.DiscoveryResponse, want int) int {
		t.Helper()
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := r.GetResources()[0].UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		if len(cla.GetEndpoints()) != 1 || cla.GetEndpoints()[0].GetPriority() != 0 {
			t.Errorf("an assignment of two states: %d localities, the first at priority %d", len(cla.GetEndpoints()), cla.GetEndpoints()[0].GetPriority())
		}
		_ = s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}, ResponseNonce: r.GetNonce()})
		return len(cla.GetEndpoints()[0].GetLbEndpoints())
	}
	if r := recv(rs, 5*time.Second); r == nil {
		t.Fatal("no first assignment")
	} else {
		check(r, 1)
	}
	for i := 2; i <= 40; i++ {
		if i%3 == 0 {
			addrs = addrs[1:] // a removal
		}
		addrs = append(addrs, fmt.Sprintf("10.8.0.%d:80", i))
		route(t, "state-app", "state-model", addrs...)
	}
	// Every push up to the last state: one locality each.
	for {
		r := recv(rs, 5*time.Second)
		if r == nil {
			t.Fatal("the last state never came")
		}
		if check(r, len(addrs)) == len(addrs) {
			cla := &endpointv3.ClusterLoadAssignment{}
			_ = r.GetResources()[0].UnmarshalTo(cla)
			if got := cla.GetEndpoints()[0].GetLbEndpoints()[len(addrs)-1].GetEndpoint().GetAddress().GetSocketAddress().GetAddress(); got == "10.8.0.40" {
				return
			}
		}
	}
}

// TestPushCostsWhatChanged: a change of one target sends its assignment
// alone to a client that follows many, and nothing to a client that
// follows another; clients of one target share one entry of the cache.
func TestPushCostsWhatChanged(t *testing.T) {
	const n = 200
	var apps []struct{ app, model string }
	for i := range n {
		apps = append(apps, struct{ app, model string }{fmt.Sprintf("many-app-%d", i), fmt.Sprintf("many-model-%d", i)})
	}
	// One write of every AppModel and slice.
	for _, a := range apps {
		appModel := fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"meta-test","labels":{"iidp":"iidp"}},"spec":{"models":[%q]}}`, a.app, a.model)
		if err := feeder.Apply("appmodels", []byte(appModel)); err != nil {
			t.Fatal(err)
		}
	}
	slice := func(app, addr string) []byte {
		return []byte(fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"meta-test","labels":{"kubernetes.io/service-name":%q}},"ports":[{"name":"http","port":80}],"endpoints":[{"addresses":[%q],"conditions":{"ready":true}}]}`, app+"-0", app, addr))
	}
	var slices [][]byte
	for i, a := range apps {
		slices = append(slices, slice(a.app, fmt.Sprintf("10.9.%d.%d", i/250, i%250+1)))
	}
	if err := feeder.Replace("endpointslices", slices...); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, n-1)
	for _, a := range apps[1:] {
		names = append(names, "chains/model-to-endpoints/"+a.model)
	}
	entriesBefore, _ := xdsSrv.cache.size()
	many := adsClient(t)
	manyRs := responses(many)
	if err := many.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < len(names) {
		r := recv(manyRs, 5*time.Second)
		if r == nil {
			t.Fatalf("%d of %d assignments came", got, len(names))
		}
		got += len(r.GetResources())
		_ = many.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: names, ResponseNonce: r.GetNonce()})
	}
	other := subscribed(t, "chains/model-to-endpoints/"+apps[0].model)
	same := subscribed(t, names[0])
	if entries, _ := xdsSrv.cache.size(); entries-entriesBefore != n {
		t.Errorf("%d cache entries for %d targets followed by 3 clients", entries-entriesBefore, n)
	}
	// Change the target of names[7]: its slice only.
	slices[8] = slice(apps[8].app, "10.9.99.1")
	if err := feeder.Replace("endpointslices", slices...); err != nil {
		t.Fatal(err)
	}
	r := recv(manyRs, 5*time.Second)
	if r == nil || len(r.GetResources()) != 1 {
		t.Fatalf("the push of one changed target to a client of %d: %v resources", len(names), len(r.GetResources()))
	}
	cla := &endpointv3.ClusterLoadAssignment{}
	if _ = r.GetResources()[0].UnmarshalTo(cla); cla.GetClusterName() != names[7] {
		t.Errorf("pushed %s, want %s", cla.GetClusterName(), names[7])
	}
	if r := recv(other, 300*time.Millisecond); r != nil {
		t.Errorf("a client of another target got a push: %v", r)
	}
	if r := recv(same, 300*time.Millisecond); r != nil {
		t.Errorf("a client of an unchanged target got a push: %v", r)
	}
}
