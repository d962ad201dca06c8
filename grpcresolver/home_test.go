package grpcresolver_test

import (
	"log/slog"
	"testing"
	"time"

	msync "github.com/iidp/metasync/sync"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/test/routingtest"
)

// TestHomeClusterFirst: of a config that reads two clusters, the resolver
// gives the home cluster's addresses while it has some, the other
// cluster's when it has none, and the home's again when they come back.
func TestHomeClusterFirst(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{
		Clusters: []schema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/nowhere/kubeconfig"}},
		Resources: []schema.Resource{{Name: "apps", Version: "v1", Resource: "configmaps",
			Indexes: []schema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	home, other := routingtest.StartBackend(t), routingtest.StartBackend(t)
	put := func(c *metasynctest.Cluster, addr string) {
		t.Helper()
		if err := c.Apply("apps", `{"metadata":{"name":"shop","namespace":"ns"},"data":{"app":"shop","addr":"`+addr+`"}}`); err != nil {
			t.Fatal(err)
		}
	}
	put(fake.In("east"), home.Addr)
	put(fake.In("west"), other.Addr)

	builder := grpcresolver.NewBuilder(fake, grpcresolver.WithLogger(slog.New(slog.DiscardHandler)))
	conn := routingtest.Dial(t, "metasync:///indexes/app-to-addr/shop", builder)
	routingtest.Within(t, 5*time.Second, "calls stay in the home cluster", func() bool {
		return routingtest.Spread(t, conn, 20, home, other)[home] == 20
	})
	if err := fake.In("east").Delete("apps", "ns/shop"); err != nil {
		t.Fatal(err)
	}
	routingtest.Within(t, 5*time.Second, "calls go to the other cluster", func() bool {
		return routingtest.Spread(t, conn, 20, home, other)[other] == 20
	})
	put(fake.In("east"), home.Addr)
	routingtest.Within(t, 5*time.Second, "calls come back home", func() bool {
		return routingtest.Spread(t, conn, 20, home, other)[home] == 20
	})
}

// wrapped is a library user's engine that embeds *sync.Engine and answers
// HomeCluster and HasIndex its own way.
type wrapped struct{ *msync.Engine }

func (wrapped) HomeCluster() string       { return "west" }
func (wrapped) HasIndex(name string) bool { return name == "shadow" }

// TestWrapperMethodsFirst: a Reader's own HomeCluster and HasIndex come
// before those of the engine it embeds (reached through Inspect), and a
// bare engine answers through its Inspector.
func TestWrapperMethodsFirst(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{
		Clusters: []schema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/nowhere/kubeconfig"}},
		Resources: []schema.Resource{{Name: "apps", Version: "v1", Resource: "configmaps",
			Indexes: []schema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	e := fake.Engine()
	if got := grpcresolver.HomeOf(e); got != "east" {
		t.Errorf("engine's home %q, want east", got)
	}
	if !grpcresolver.HasIndex(e, "app-to-addr") {
		t.Error("the engine has no app-to-addr")
	}
	w := wrapped{e}
	if got := grpcresolver.HomeOf(w); got != "west" {
		t.Errorf("wrapper's home %q, want its own west", got)
	}
	if !grpcresolver.HasIndex(w, "shadow") || grpcresolver.HasIndex(w, "app-to-addr") {
		t.Error("the wrapper's HasIndex was passed over")
	}
}
