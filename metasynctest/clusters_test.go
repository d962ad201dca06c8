package metasynctest_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// TestFakeClusters: a Fake of a config that reads two clusters keeps each
// cluster's part apart: the answer is the union, each value once; a
// Replace or Delete in one cluster leaves the other's part; explain names
// each object's cluster; an unknown cluster, or one that an entry is not
// read in, is an error that says so. No kubeconfig file is read.
func TestFakeClusters(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{
		Clusters: []schema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/nowhere/kubeconfig"}},
		Resources: []schema.Resource{
			{Name: "apps", Version: "v1", Resource: "configmaps",
				Indexes: []schema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}}},
			{Name: "east-only", Version: "v1", Resource: "services", Clusters: []string{"east"},
				Indexes: []schema.Index{{Name: "service-to-app", Key: "metadata.name", Value: "metadata.labels.app"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	cm := func(name, addr string) string {
		return `{"metadata":{"name":"` + name + `","namespace":"ns"},"data":{"app":"shop","addr":"` + addr + `"}}`
	}
	must(t, fake.Apply("apps", cm("a", "10.0.0.1:80")))            // the home: east
	must(t, fake.In("west").Apply("apps", cm("a", "10.0.0.2:80"))) // the same key, another cluster
	must(t, fake.In("west").Apply("apps", cm("b", "10.0.0.1:80"))) // a value east gives too
	if got := fake.Lookup("app-to-addr", "shop"); !slices.Equal(got, []string{"10.0.0.1:80", "10.0.0.2:80"}) {
		t.Fatalf("union = %q", got)
	}
	a := fake.Answer(msync.KeyOf("app-to-addr", "shop"))
	if !a.Synced || len(a.Clusters) != 2 || !a.Clusters["east"].Synced || !a.Clusters["west"].Synced {
		t.Fatalf("answer's clusters: %+v", a)
	}
	x := fake.Explain(msync.KeyOf("app-to-addr", "shop"))
	var seen []string
	for _, o := range x.Steps[0].Objects {
		seen = append(seen, o.Cluster+" "+o.Key)
	}
	slices.Sort(seen)
	if want := []string{"east ns/a", "west ns/a", "west ns/b"}; !slices.Equal(seen, want) {
		t.Fatalf("explained objects %q, want %q", seen, want)
	}
	// Narrowed to west: west's part, west's objects, west's state.
	x = fake.Explain(msync.Target{Index: "app-to-addr", Key: "shop", Cluster: "west"})
	seen = nil
	for _, o := range x.Steps[0].Objects {
		seen = append(seen, o.Key+" "+strings.Join(o.Values, ","))
	}
	slices.Sort(seen)
	if want := []string{"ns/a 10.0.0.2:80", "ns/b 10.0.0.1:80"}; !slices.Equal(seen, want) ||
		!slices.Equal(x.Values, []string{"10.0.0.1:80", "10.0.0.2:80"}) || len(x.Clusters) != 1 || !x.Clusters["west"].Synced || !x.Synced {
		t.Fatalf("explained in west: objects %q, %+v", seen, x.Answer)
	}

	// West relists without b, then deletes a: east's part stays.
	must(t, fake.In("west").Replace("apps", cm("a", "10.0.0.3:80")))
	if got := fake.Lookup("app-to-addr", "shop"); !slices.Equal(got, []string{"10.0.0.1:80", "10.0.0.3:80"}) {
		t.Fatalf("after west's replace = %q", got)
	}
	must(t, fake.In("west").Delete("apps", "ns/a"))
	if got := fake.Lookup("app-to-addr", "shop"); !slices.Equal(got, []string{"10.0.0.1:80"}) {
		t.Fatalf("after west's delete = %q", got)
	}
	must(t, fake.Delete("apps", "ns/a"))
	if got := fake.Lookup("app-to-addr", "shop"); len(got) != 0 {
		t.Fatalf("after east's delete = %q", got)
	}

	for _, c := range []struct {
		err  error
		want string
	}{
		{fake.In("south").Apply("apps", cm("a", "x:1")), `unknown cluster "south" (resource apps is read in: east, west)`},
		{fake.In("west").Apply("east-only", cm("a", "x:1")), `resource east-only is not read in cluster "west" (only in: east)`},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("error %v, want %q", c.err, c.want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestFakeClusterPart: a Fake answers a target narrowed to one cluster
// (Target.Cluster) as the engine does.
func TestFakeClusterPart(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{
		Clusters: []schema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/nowhere/kubeconfig"}},
		Resources: []schema.Resource{{Name: "apps", Version: "v1", Resource: "configmaps",
			Indexes: []schema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"},
				{Name: "app-owner", Key: "data.app", Value: "data.owner", Unique: true}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	cm := func(name, addr string) string {
		return `{"metadata":{"name":"` + name + `","namespace":"ns"},"data":{"app":"shop","addr":"` + addr + `"}}`
	}
	must(t, fake.Apply("apps", cm("a", "10.0.0.1:80")))
	must(t, fake.In("west").Apply("apps", cm("b", "10.0.0.2:80")))
	for cluster, want := range map[string][]string{"east": {"10.0.0.1:80"}, "west": {"10.0.0.2:80"}} {
		a := fake.Answer(msync.Target{Index: "app-to-addr", Key: "shop", Cluster: cluster})
		if !slices.Equal(a.Values, want) || !a.Synced {
			t.Errorf("%s's part: %+v, want %q", cluster, a, want)
		}
	}

	// West comes to give a value that east gives: the whole answer stays
	// the same, west's part changes, and a subscription narrowed to west
	// hears of it; and again when west withdraws it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := fake.Subscribe(ctx, msync.Target{Index: "app-to-addr", Key: "shop", Cluster: "west"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	next := func(want ...string) {
		t.Helper()
		ev, err := sub.Next(ctx)
		if err != nil || !slices.Equal(ev.Values, want) {
			t.Fatalf("west's stream: %+v, %v; want %q", ev, err, want)
		}
	}
	next("10.0.0.2:80")
	must(t, fake.In("west").Apply("apps", cm("c", "10.0.0.1:80")))
	next("10.0.0.1:80", "10.0.0.2:80")
	must(t, fake.In("west").Delete("apps", "ns/c"))
	next("10.0.0.2:80")
	if got := fake.Lookup("app-to-addr", "shop"); !slices.Equal(got, []string{"10.0.0.1:80", "10.0.0.2:80"}) {
		t.Fatalf("union = %q", got)
	}

	// A unique key claimed in both clusters, as many values each: the
	// answer is one claimant's (east's, the first cluster by name), and
	// west's part of it is empty, not east's value under west's name.
	owned := func(name, owner string) string {
		return `{"metadata":{"name":"` + name + `","namespace":"ns"},"data":{"app":"store","owner":"` + owner + `"}}`
	}
	must(t, fake.Apply("apps", owned("c", "team-a")))
	must(t, fake.In("west").Apply("apps", owned("c", "team-b")))
	if got := fake.Lookup("app-owner", "store"); !slices.Equal(got, []string{"team-a"}) {
		t.Fatalf("unique answer = %q, want team-a", got)
	}
	for cluster, want := range map[string][]string{"east": {"team-a"}, "west": nil} {
		a := fake.Answer(msync.Target{Index: "app-owner", Key: "store", Cluster: cluster})
		if !slices.Equal(a.Values, want) {
			t.Errorf("%s's part of the unique key: %q, want %q", cluster, a.Values, want)
		}
	}
}

// TestFakeClusterPartHints: a cluster's part narrowed by a node and a
// zone: the node's endpoints are all east's (so the whole answer at n1
// is east's), none west's; west's part is then narrowed by the zone, as
// at the zone alone, not left whole.
func TestFakeClusterPartHints(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{
		Clusters: []schema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/nowhere"}},
		Resources: []schema.Resource{{Name: "endpointslices", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices",
			Indexes: []schema.Index{{Name: "svc", Key: "metadata.labels.svc", Value: `@endpoints`, Hints: `@endpoints:{"hints":true}`}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	must(t, fake.In("east").Apply("endpointslices", `{"metadata":{"name":"e","namespace":"ns","labels":{"svc":"s"}},
"endpoints":[{"addresses":["10.0.0.1"],"hints":{"forZones":[{"name":"z1"}],"forNodes":[{"name":"n1"}]}}]}`))
	must(t, fake.In("west").Apply("endpointslices", `{"metadata":{"name":"w","namespace":"ns","labels":{"svc":"s"}},
"endpoints":[{"addresses":["10.1.0.1"],"hints":{"forZones":[{"name":"z1"}],"forNodes":[{"name":"n2"}]}},
             {"addresses":["10.1.0.2"],"hints":{"forZones":[{"name":"z2"}],"forNodes":[{"name":"n3"}]}}]}`))
	at := msync.Locality{Zone: "z1", Node: "n1"}
	whole := fake.Answer(msync.Target{Index: "svc", Key: "s", At: at}).Values
	west := fake.Answer(msync.Target{Index: "svc", Key: "s", At: at, Cluster: "west"}).Values
	westZone := fake.Answer(msync.Target{Index: "svc", Key: "s", At: msync.Locality{Zone: "z1"}, Cluster: "west"}).Values
	if !slices.Equal(whole, []string{"10.0.0.1"}) {
		t.Errorf("whole answer at node n1 = %q, want east's [10.0.0.1]", whole)
	}
	if !slices.Equal(west, []string{"10.1.0.1"}) {
		t.Errorf("west's part at node n1, zone z1 = %q, want [10.1.0.1] (west's z1 endpoint, as at zone z1 alone: %q)", west, westZone)
	}
}
