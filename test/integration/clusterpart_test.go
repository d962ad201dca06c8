package integration_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// TestClusterPart narrows answers and subscriptions to one cluster's
// part (Target.Cluster) on two control planes: a key's and a chain
// key's part, each cluster's synced and stale alone, and a subscription
// that hears of its cluster withdrawing a value that the other cluster
// still gives (the whole answer unchanged).
func TestClusterPart(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	const ns = "cluster-part"
	ensureNamespace(t, env.Kube, ns)
	ensureNamespace(t, west.Kube, ns)
	plan, err := mschema.Compile(&mschema.Config{
		Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/unused/in/code"}},
		Resources: []mschema.Resource{{
			Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
			Indexes: []mschema.Index{
				{Name: "app-to-addr", Key: "data.app", Value: "data.addr"},
				{Name: "addr-to-app", Key: "data.addr", Value: "data.app"},
			},
		}},
		Chains: []mschema.Chain{{Name: "addr-to-peers", Indexes: []string{"addr-to-app", "app-to-addr"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	putConfigMap(t, env.Kube, ns, "e1", "shop")
	putConfigMap(t, west.Kube, ns, "w1", "shop")
	putConfigMap(t, env.Kube, ns, "same", "shop")
	putConfigMap(t, west.Kube, ns, "same", "shop")
	e := runEngineWith(t, plan, env.Config, msync.Options{ClusterConfigs: map[string]*rest.Config{"west": rest.CopyConfig(west.Config)}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	if home := e.Inspect().HomeCluster(); home != "east" {
		t.Fatalf("home %q", home)
	}
	part := func(t msync.Target, cluster string) msync.Target { t.Cluster = cluster; return t }
	expectPart := func(tg msync.Target, want ...string) {
		t.Helper()
		testenv.Eventually(t, fmt.Sprintf("%+v answers %q", tg, want), func() string {
			a := e.Inspect().Answer(tg)
			if !slices.Equal(a.Values, want) || !a.Synced || len(a.Clusters) != 1 || !a.Clusters[tg.Cluster].Synced {
				return fmt.Sprintf("%+v", a)
			}
			// The same as AnswerIn, and as the cluster's objects say
			// (read from the whole answer's explanation).
			if b, err := e.Inspect().AnswerIn(msync.Target{Index: tg.Index, Chain: tg.Chain, Key: tg.Key}, tg.Cluster); err != nil || !slices.Equal(b.Values, want) {
				return fmt.Sprintf("AnswerIn %+v %v", b, err)
			}
			if got := partFromObjects(e, tg); !slices.Equal(got, want) {
				return fmt.Sprintf("from the objects: %q", got)
			}
			return ""
		})
	}
	expect(t, e, "app-to-addr", "shop", "e1:80", "same:80", "w1:80")
	expectPart(part(msync.KeyOf("app-to-addr", "shop"), "east"), "e1:80", "same:80")
	expectPart(part(msync.KeyOf("app-to-addr", "shop"), "west"), "same:80", "w1:80")
	// A chain is narrowed by its last step: its first is the whole
	// answer's. w1:80 is west's alone and e1:80 east's alone, yet each
	// cluster's part of either is that cluster's peers of "shop".
	expectPart(part(msync.ChainOf("addr-to-peers", "w1:80"), "west"), "same:80", "w1:80")
	expectPart(part(msync.ChainOf("addr-to-peers", "w1:80"), "east"), "e1:80", "same:80")
	expectPart(part(msync.ChainOf("addr-to-peers", "e1:80"), "west"), "same:80", "w1:80")
	expectPart(part(msync.ChainOf("addr-to-peers", "nowhere:80"), "west")) // no step answers
	// Explain names each object by namespace/name, its cluster beside
	// it: "same" once in each cluster.
	var named []string
	for _, o := range e.Explain(msync.KeyOf("app-to-addr", "shop")).Steps[0].Objects {
		named = append(named, o.Cluster+" "+o.Key)
	}
	slices.Sort(named)
	if want := []string{"east " + ns + "/e1", "east " + ns + "/same", "west " + ns + "/same", "west " + ns + "/w1"}; !slices.Equal(named, want) {
		t.Fatalf("explained objects %q, want %q", named, want)
	}
	if _, err := e.Subscribe(ctx, part(msync.KeyOf("app-to-addr", "shop"), "north")); err == nil {
		t.Fatal("an unknown cluster subscribed")
	}

	sub, err := e.Subscribe(ctx, part(msync.KeyOf("app-to-addr", "shop"), "west"))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	next := func(want ...string) {
		t.Helper()
		ev, err := sub.Next(ctx)
		if err != nil || !slices.Equal(ev.Values, want) {
			t.Fatalf("event %+v %v, want %q", ev, err, want)
		}
	}
	next("same:80", "w1:80")
	// West withdraws same:80, which east still gives: the whole answer
	// stays, west's part changes.
	if err := west.Kube.CoreV1().ConfigMaps(ns).Delete(ctx, "same", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next("w1:80")
	expect(t, e, "app-to-addr", "shop", "e1:80", "same:80", "w1:80")
	putConfigMap(t, west.Kube, ns, "w2", "shop")
	next("w1:80", "w2:80")
	putConfigMap(t, env.Kube, ns, "e2", "shop") // east's: nothing for west
	expectPart(part(msync.KeyOf("app-to-addr", "shop"), "east"), "e1:80", "e2:80", "same:80")
	putConfigMap(t, west.Kube, ns, "w1", "cart")
	next("w2:80")
}

// partFromObjects computes a cluster's part of tg's answer from the
// objects that the whole answer's explanation lists: the whole answer's
// steps but the last, then the values that the cluster's objects give
// the keys of the step before, and that the step answers.
func partFromObjects(e *msync.Engine, tg msync.Target) []string {
	cluster := tg.Cluster
	tg.Cluster = ""
	x := e.Explain(tg)
	keys := map[string]bool{tg.Key: true}
	for i, st := range x.Steps {
		next := map[string]bool{}
		if i < len(x.Steps)-1 {
			for _, v := range st.Values {
				next[v] = true
			}
			keys = next
			continue
		}
		for _, o := range st.Objects {
			if o.Cluster != cluster || !keys[o.IndexKey] {
				continue
			}
			for _, v := range o.Values {
				if !slices.Contains(o.Unanswered, v) {
					next[v] = true
				}
			}
		}
		keys = next
	}
	var out []string
	for k := range keys {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
