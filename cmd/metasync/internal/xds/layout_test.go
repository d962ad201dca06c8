package xds

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
)

// TestAssignmentLayout: the priorities of an assignment by zone and home
// cluster, each group with endpoints one locality, priorities without a
// gap.
func TestAssignmentLayout(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	all := []string{"1.0.0.1:80", "1.0.0.2:80", "2.0.0.1:80", "2.0.0.2:80"} // 1.*: home; *.*.*.1: zone a
	home := []string{"1.0.0.1:80", "1.0.0.2:80"}
	near := []string{"1.0.0.1:80", "2.0.0.1:80"}
	for _, c := range []struct {
		name string
		p    parts
		want string // per priority: zone/subzone=endpoints
	}{
		{"one cluster", parts{values: all}, "/=1.0.0.1,1.0.0.2,2.0.0.1,2.0.0.2"},
		{"zone", parts{values: all, local: near, zone: "a"}, "a/=1.0.0.1,2.0.0.1 /=1.0.0.2,2.0.0.2"},
		{"home", parts{values: all, home: home, homeName: "east"}, "/east=1.0.0.1,1.0.0.2 /=2.0.0.1,2.0.0.2"},
		{"home and zone", parts{values: all, local: near, zone: "a", home: home, homeName: "east"},
			"a/east=1.0.0.1 /east=1.0.0.2 a/=2.0.0.1 /=2.0.0.2"},
		{"the zone only elsewhere", parts{values: all, local: []string{"2.0.0.1:80"}, zone: "a", home: home, homeName: "east"},
			"/east=1.0.0.1,1.0.0.2 a/=2.0.0.1 /=2.0.0.2"},
		{"the home's all in the zone", parts{values: all, local: home, zone: "a", home: home, homeName: "east"},
			"a/east=1.0.0.1,1.0.0.2 /=2.0.0.1,2.0.0.2"},
		{"the home empty", parts{values: all[2:], local: []string{"2.0.0.1:80"}, zone: "a", homeName: "east"},
			"a/=2.0.0.1 /=2.0.0.2"},
		{"only the home", parts{values: home, home: home, homeName: "east"}, "/=1.0.0.1,1.0.0.2"},
	} {
		got := &endpointv3.ClusterLoadAssignment{}
		if err := proto.Unmarshal(s.encodeAnswer("x", c.p), got); err != nil {
			t.Fatal(err)
		}
		var ps []string
		for i, l := range got.GetEndpoints() {
			if int(l.GetPriority()) != i {
				t.Errorf("%s: locality %d has priority %d", c.name, i, l.GetPriority())
			}
			var eps []string
			for _, e := range l.GetLbEndpoints() {
				eps = append(eps, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
			}
			slices.Sort(eps)
			ps = append(ps, l.GetLocality().GetZone()+"/"+l.GetLocality().GetSubZone()+"="+strings.Join(eps, ","))
		}
		if g := strings.Join(ps, " "); g != c.want {
			t.Errorf("%s: %s, want %s", c.name, g, c.want)
		}
	}
}
