package xds

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
)

// FuzzDecodeRequest: any bytes decode or fail without a panic, and what
// decodes as a DiscoveryRequest for go-control-plane decodes the same
// names, type and nonce here.
func FuzzDecodeRequest(f *testing.F) {
	seed, _ := proto.Marshal(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "n", Locality: &corev3.Locality{Zone: "z"}},
		ResourceNames: []string{"chains/c/k"}, TypeUrl: TypeEndpoint, ResponseNonce: "1"})
	f.Add(seed)
	f.Add([]byte{0x0a, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeRequest(b)
		var want discoveryv3.DiscoveryRequest
		if proto.Unmarshal(b, &want) != nil || err != nil {
			return
		}
		if got.typeURL != want.GetTypeUrl() || got.responseNonce != want.GetResponseNonce() || len(got.resourceNames) != len(want.GetResourceNames()) {
			t.Errorf("decodeRequest = %+v, go-control-plane %v", got, &want)
		}
	})
}
