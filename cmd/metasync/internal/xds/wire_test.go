package xds

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/google/go-cmp/cmp"
)

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}, ResourceApiVersion: corev3.ApiVersion_V3}
}

// same decodes b as a message like want and compares the two.
func same(t *testing.T, what string, b []byte, want proto.Message) {
	t.Helper()
	got := want.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(b, got); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Errorf("%s differs from go-control-plane's (-want +got):\n%s", what, d)
	}
}

// TestEncodings: each hand-written encoding is the message that
// go-control-plane's types build, field for field (Anys unpacked).
func TestEncodings(t *testing.T) {
	name := "chains/model-to-endpoints/model1"
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix:     "metasync",
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{ConfigSource: ads(), RouteConfigName: name}},
		HttpFilters:    []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &routerv3.Router{})}}},
	}
	lis := &listenerv3.Listener{}
	if err := proto.Unmarshal(encodeListener(name), lis); err != nil {
		t.Fatal(err)
	}
	if lis.GetName() != name {
		t.Errorf("listener name %q", lis.GetName())
	}
	gotHCM := &hcmv3.HttpConnectionManager{}
	if err := lis.GetApiListener().GetApiListener().UnmarshalTo(gotHCM); err != nil {
		t.Fatalf("api listener: %v", err)
	}
	if d := cmp.Diff(hcm, gotHCM, protocmp.Transform()); d != "" {
		t.Errorf("HTTP connection manager (-want +got):\n%s", d)
	}
	if f := gotHCM.GetHttpFilters(); len(f) == 1 {
		if err := f[0].GetTypedConfig().UnmarshalTo(&routerv3.Router{}); err != nil {
			t.Errorf("router filter: %v", err)
		}
	}
	same(t, "route configuration", encodeRoute(name, "chains/c/k"), &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{Name: name, Domains: []string{"*"}, Routes: []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "chains/c/k"}}},
		}}}},
	})
	same(t, "cluster", encodeCluster("chains/c/k"), &clusterv3.Cluster{
		Name:                 "chains/c/k",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: "chains/c/k"},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	})
	ep := func(host string, port uint32) *endpointv3.LbEndpoint {
		return &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}}},
			HealthStatus:        corev3.HealthStatus_HEALTHY,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}
	}
	same(t, "assignment", encodeAssignment("chains/c/k", []locality{{eps: []endpoint{{"10.0.0.5", 8080}, {"fd00::5", 9090}}}}), &endpointv3.ClusterLoadAssignment{
		ClusterName: "chains/c/k",
		Endpoints: []*endpointv3.LocalityLbEndpoints{{
			Locality:            &corev3.Locality{},
			LbEndpoints:         []*endpointv3.LbEndpoint{ep("10.0.0.5", 8080), ep("fd00::5", 9090)},
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}},
	})
	same(t, "empty assignment", encodeAssignment("chains/c/k", nil), &endpointv3.ClusterLoadAssignment{ClusterName: "chains/c/k"})
	same(t, "assignment by zone", encodeAssignment("chains/c/k", []locality{{zone: "zone-a", eps: []endpoint{{"10.0.0.5", 8080}}}, {priority: 1, eps: []endpoint{{"10.0.0.6", 8080}}}}), &endpointv3.ClusterLoadAssignment{
		ClusterName: "chains/c/k",
		Endpoints: []*endpointv3.LocalityLbEndpoints{
			{Locality: &corev3.Locality{Zone: "zone-a"}, LbEndpoints: []*endpointv3.LbEndpoint{ep("10.0.0.5", 8080)}, LoadBalancingWeight: wrapperspb.UInt32(1)},
			{Locality: &corev3.Locality{}, LbEndpoints: []*endpointv3.LbEndpoint{ep("10.0.0.6", 8080)}, LoadBalancingWeight: wrapperspb.UInt32(1), Priority: 1},
		},
	})
	resp := &discoveryv3.DiscoveryResponse{}
	if err := proto.Unmarshal(encodeFrame(TypeCluster, "3", "3", [][]byte{encodeCluster("a/b/c")})[frameHeader:], resp); err != nil {
		t.Fatal(err)
	}
	if resp.GetTypeUrl() != TypeCluster || resp.GetVersionInfo() != "3" || resp.GetNonce() != "3" || len(resp.GetResources()) != 1 || resp.GetResources()[0].GetTypeUrl() != TypeCluster {
		t.Errorf("response %v", resp)
	}
}

// TestDecodeRequest reads what go-control-plane's types write.
func TestDecodeRequest(t *testing.T) {
	b, err := proto.Marshal(&discoveryv3.DiscoveryRequest{
		VersionInfo:   "7",
		Node:          &corev3.Node{Id: "pod-1", Locality: &corev3.Locality{Region: "r", Zone: "zone-a"}, UserAgentName: "grpc-go"},
		ResourceNames: []string{"chains/c/k", "indexes/i/k"},
		TypeUrl:       TypeEndpoint,
		ResponseNonce: "7",
		ErrorDetail:   &status.Status{Code: 3, Message: "duplicate address"},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeRequest(b)
	want := request{versionInfo: "7", nodeID: "pod-1", zone: "zone-a", resourceNames: []string{"chains/c/k", "indexes/i/k"}, typeURL: TypeEndpoint, responseNonce: "7", nack: true, nackMessage: "duplicate address"}
	if err != nil || !cmp.Equal(got, want, cmp.AllowUnexported(request{})) {
		t.Errorf("decodeRequest = %+v, %v\nwant %+v", got, err, want)
	}
	if _, err := decodeRequest([]byte{0xff, 0xff}); err == nil {
		t.Error("garbage decoded")
	}
}

// TestRequestTextBounded: what a stream keeps of a request's free text is
// bounded: a node id and a NACK's reason are cut, a zone beyond any
// zone's name is refused.
func TestRequestTextBounded(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	b, _ := proto.Marshal(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: long}, TypeUrl: TypeEndpoint,
		ErrorDetail: &status.Status{Message: long}})
	r, err := decodeRequest(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.nodeID) > maxNodeID+len("…") || len(r.nackMessage) > maxNackMessage+len("…") {
		t.Errorf("kept a node id of %d bytes and a reason of %d", len(r.nodeID), len(r.nackMessage))
	}
	b, _ = proto.Marshal(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Locality: &corev3.Locality{Zone: long}}})
	if _, err := decodeRequest(b); err == nil {
		t.Error("a zone of 1 MiB was taken")
	}
}
