package sync_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// TestObjectKeysOfClusters: of a config that reads two clusters, every
// accessor that names objects gives each its key as namespace/name and
// its cluster beside it, also for the same namespace/name in both:
// Explain (narrowed or not), IndexFields, ResourceFields (a key alone
// names each cluster's object, CLUSTER:key one cluster's), Object, List,
// and the last rule failure of Indexes and Status.
func TestObjectKeysOfClusters(t *testing.T) {
	plan, err := schema.Compile(&schema.Config{
		Clusters: []schema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/nowhere/kubeconfig"}},
		Resources: []schema.Resource{{Name: "apps", Version: "v1", Resource: "configmaps",
			Fields:  map[string]string{"addr": "data.addr"},
			Indexes: []schema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e, feed, err := msync.NewOffline(plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	cm := func(name, app, addr string) []byte {
		return []byte(`{"metadata":{"name":"` + name + `","namespace":"ns"},"data":{"app":` + app + `,"addr":"` + addr + `"}}`)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(feed.In("east").Apply("apps", cm("same", `"shop"`, "e:80"), cm("e1", `"shop"`, "e1:80")))
	must(feed.In("west").Apply("apps", cm("same", `"shop"`, "w:80")))
	if err := feed.In("west").Apply("apps", cm("odd", `{"not":"a string"}`, "x:80")); err == nil {
		t.Fatal("a rule that fails: no error")
	}

	named := func(objs []msync.ExplainedObject) []string {
		var out []string
		for _, o := range objs {
			out = append(out, o.Cluster+" "+o.Key)
		}
		slices.Sort(out)
		return out
	}
	x := e.Explain(msync.KeyOf("app-to-addr", "shop"))
	if got, want := named(x.Steps[0].Objects), []string{"east ns/e1", "east ns/same", "west ns/same"}; !slices.Equal(got, want) {
		t.Fatalf("explained objects %q, want %q", got, want)
	}
	x = e.Explain(msync.Target{Index: "app-to-addr", Key: "shop", Cluster: "west"})
	if got, want := named(x.Steps[0].Objects), []string{"west ns/same"}; !slices.Equal(got, want) {
		t.Fatalf("explained in west %q, want %q", got, want)
	}

	fields := func(objs []msync.ObjectFields, err error) string {
		t.Helper()
		must(err)
		out := ""
		for _, o := range objs {
			out += fmt.Sprintf("[%s %s %s]", o.Cluster, o.Key, o.JSON)
		}
		return out
	}
	for _, c := range []struct {
		what, got, want string
	}{
		{"IndexFields", fields(e.IndexFields("app-to-addr", "shop")),
			`[east ns/e1 {"addr":"e1:80"}][east ns/same {"addr":"e:80"}][west ns/same {"addr":"w:80"}]`},
		{"ResourceFields of a key in both", fields(e.ResourceFields("apps", "ns/same")),
			`[east ns/same {"addr":"e:80"}][west ns/same {"addr":"w:80"}]`},
		{"ResourceFields of west's", fields(e.ResourceFields("apps", "west:ns/same")), `[west ns/same {"addr":"w:80"}]`},
		{"ResourceFields of a key in east alone", fields(e.ResourceFields("apps", "ns/e1", "west:ns/e1")), `[east ns/e1 {"addr":"e1:80"}]`},
		{"ResourceFields of all", fields(e.ResourceFields("apps")),
			`[east ns/e1 {"addr":"e1:80"}][west ns/odd {"addr":"x:80"}][east ns/same {"addr":"e:80"}][west ns/same {"addr":"w:80"}]`},
	} {
		if c.got != c.want {
			t.Errorf("%s: %s, want %s", c.what, c.got, c.want)
		}
	}
	type app struct{ Addr string }
	if a, found, err := msync.Object[app](e, "apps", "ns/same"); err != nil || !found || a.Addr != "e:80" {
		t.Errorf("Object of a key in both: %+v %v %v, want east's", a, found, err)
	}
	if a, found, err := msync.Object[app](e, "apps", "west:ns/same"); err != nil || !found || a.Addr != "w:80" {
		t.Errorf("Object of west's: %+v %v %v", a, found, err)
	}

	for _, ix := range e.Indexes() {
		if rf := ix.LastRuleError; ix.Name != "app-to-addr" || rf == nil || rf.Object != "ns/odd" || rf.Cluster != "west" {
			t.Errorf("index %s: last rule failure %+v, want west's ns/odd", ix.Name, rf)
		}
	}
	for _, st := range e.Status() {
		rf, ok := st.LastRuleError["app-to-addr"]
		if st.Cluster == "west" && (!ok || rf.Object != "ns/odd" || rf.Cluster != "west") || st.Cluster == "east" && ok {
			t.Errorf("status of %s in %s: last rule failure %+v", st.Name, st.Cluster, st.LastRuleError)
		}
	}
}
