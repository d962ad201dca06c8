package integration_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// warmClustersPlan is the plan of TestWarmStartPerCluster: ConfigMaps
// of ns in each of clusters (the first one the engine's own).
func warmClustersPlan(t *testing.T, ns string, clusters ...string) *mschema.Plan {
	t.Helper()
	cfg := &mschema.Config{
		Resources: []mschema.Resource{{
			Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
			Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}},
		}},
	}
	for i, c := range clusters {
		cl := mschema.Cluster{Name: c}
		if i > 0 {
			cl.Kubeconfig = "/unused/in/code"
		}
		cfg.Clusters = append(cfg.Clusters, cl)
	}
	plan, err := mschema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// warmClusters builds an engine of plan with a snapshot folder, the
// clusters other than the engine's own given by configs.
func warmClusters(t *testing.T, plan *mschema.Plan, dir string, configs map[string]*rest.Config) (*msync.Engine, *testenv.Buffer) {
	t.Helper()
	logs := &testenv.Buffer{}
	e, err := msync.New(plan, env.Config, msync.Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		StaleAfter: 5 * time.Second, SnapshotDir: dir, SnapshotInterval: time.Hour, ClusterConfigs: configs})
	if err != nil {
		t.Fatal(err)
	}
	return e, logs
}

// relistsOf returns the complete lists of each cluster's part of the
// resource.
func relistsOf(e *msync.Engine) map[string]int64 {
	out := map[string]int64{}
	for _, st := range e.Status() {
		out[st.Cluster] = st.Relists
	}
	return out
}

// clusterLoads returns how each cluster's part started, as "load/reason".
func clusterLoads(e *msync.Engine) map[string]string {
	out := map[string]string{}
	for _, c := range e.Inspect().SnapshotStatus().Clusters {
		out[c.Name] = c.Load + "/" + c.LoadReason
	}
	return out
}

// TestWarmStartPerCluster: an engine of two clusters (two control planes)
// writes its snapshot and stops; both clusters change while it is down
// (a delete, an add, a change in each). The next engine answers at once
// from both clusters' parts, stale in each, then each part catches up by
// resuming its own watch (no list): nothing lost, nothing deleted left.
// Then the name "west" points at the other control plane: its identity
// (kube-system's UID) differs, and west's part alone is dropped and
// listed (cold) while east's resumes warm. Last, a config without west
// and with a cluster the snapshot lacks: west's part is not restored,
// the new cluster starts cold alone.
func TestWarmStartPerCluster(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	stopWest := onceOnly(func() { _ = west.Stop() })
	defer stopWest()
	const ns = "warm-clusters"
	ensureNamespace(t, env.Kube, ns)
	ensureNamespace(t, west.Kube, ns)
	putConfigMap(t, env.Kube, ns, "e1", "shop")
	putConfigMap(t, env.Kube, ns, "e-del", "shop")
	putConfigMap(t, env.Kube, ns, "e-mod", "shop")
	putConfigMap(t, west.Kube, ns, "w1", "shop")
	putConfigMap(t, west.Kube, ns, "w-del", "shop")
	putConfigMap(t, west.Kube, ns, "w-mod", "shop")
	dir := t.TempDir()
	plan := warmClustersPlan(t, ns, "east", "west")
	westCfg := rest.CopyConfig(west.Config)

	// The first run: cold, synced, stopped (the snapshot written).
	e, logs := warmClusters(t, plan, dir, map[string]*rest.Config{"west": westCfg})
	if got := clusterLoads(e); got["east"] != "cold/missing" || got["west"] != "cold/missing" {
		t.Errorf("first start: %v", got)
	}
	stop := run(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	all := []string{"e-del:80", "e-mod:80", "e1:80", "w-del:80", "w-mod:80", "w1:80"}
	expect(t, e, "app-to-addr", "shop", all...)
	stop()
	if st := e.Inspect().SnapshotStatus(); st.Writes < 1 || st.Objects != 6 {
		t.Fatalf("snapshot at the stop: %+v\n%s", st, logs)
	}

	// Meanwhile, in both clusters.
	del := func(kube interface {
		Delete(context.Context, string, metav1.DeleteOptions) error
	}, name string) {
		if err := kube.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	del(env.Kube.CoreV1().ConfigMaps(ns), "e-del")
	del(west.Kube.CoreV1().ConfigMaps(ns), "w-del")
	putConfigMap(t, env.Kube, ns, "e2", "shop")
	putConfigMap(t, west.Kube, ns, "w2", "shop")
	putConfigMap(t, env.Kube, ns, "e-mod", "moved")
	putConfigMap(t, west.Kube, ns, "w-mod", "moved")

	// Warm: both parts answer at once, before anything is asked of either
	// apiserver, stale in each cluster's state.
	e, logs = warmClusters(t, plan, dir, map[string]*rest.Config{"west": westCfg})
	if st := e.Inspect().SnapshotStatus(); st.Load != "warm" || len(st.Clusters) != 2 ||
		clusterLoads(e)["east"] != "warm/" || clusterLoads(e)["west"] != "warm/" {
		t.Fatalf("second start: %+v\n%s", st, logs)
	}
	a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
	if !slices.Equal(a.Values, all) || !a.Stale || !a.Synced || !a.Clusters["east"].Stale || !a.Clusters["west"].Stale ||
		!a.Clusters["east"].Synced || !a.Clusters["west"].Synced {
		t.Fatalf("before Start, the snapshot's answer, stale in both clusters: %+v", a)
	}
	stop = run(t, e)
	expect(t, e, "app-to-addr", "shop", "e1:80", "e2:80", "w1:80", "w2:80")
	expect(t, e, "app-to-addr", "moved", "e-mod:80", "w-mod:80")
	testenv.Eventually(t, "both clusters caught up, fresh", func() string {
		a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
		if a.Stale || a.Clusters["east"].Stale || a.Clusters["west"].Stale || !e.Ready() {
			return fmt.Sprintf("%+v ready=%v", a, e.Ready())
		}
		return ""
	})
	if got := relistsOf(e); got["east"] != 0 || got["west"] != 0 {
		t.Errorf("a cluster listed instead of resuming: %v\n%s", got, logs)
	}
	stop()

	// West's name now reaches the other control plane: another identity.
	// West's part alone starts cold; east's resumes.
	stopWest()
	e, logs = warmClusters(t, plan, dir, map[string]*rest.Config{"west": env.Config})
	a = e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
	if !slices.Equal(a.Values, []string{"e1:80", "e2:80", "w1:80", "w2:80"}) || !a.Clusters["west"].Stale || !a.Clusters["east"].Stale {
		t.Fatalf("before Start: %+v", a)
	}
	putConfigMap(t, env.Kube, ns, "e3", "shop")
	stop = run(t, e)
	// West's part is now what the other control plane holds (east's
	// objects, under west's name); nothing of the old west stays.
	expect(t, e, "app-to-addr", "shop", "e1:80", "e2:80", "e3:80")
	expect(t, e, "app-to-addr", "moved", "e-mod:80")
	testenv.Eventually(t, "west cold, east warm, both fresh", func() string {
		a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
		if a.Stale || !a.Synced || a.Clusters["west"].Stale || a.Clusters["east"].Stale || !e.Ready() {
			return fmt.Sprintf("%+v ready=%v", a, e.Ready())
		}
		if got := clusterLoads(e); got["east"] != "warm/" || got["west"] != "cold/cluster" {
			return fmt.Sprintf("loads %v", got)
		}
		return ""
	})
	if got := relistsOf(e); got["east"] != 0 || got["west"] < 1 {
		t.Errorf("east must resume, west list: %v\n%s", got, logs)
	}
	if st := e.Inspect().SnapshotStatus(); st.Load != "warm" {
		t.Errorf("one cluster cold makes the start cold: %+v", st)
	}
	if objects := e.Status(); len(objects) != 2 || objects[0].Objects != 4 || objects[1].Objects != 4 {
		t.Errorf("objects per cluster: %+v", objects)
	}
	stop()

	// West gone from the config, north new: east warm, west's part not
	// restored, north cold alone.
	plan = warmClustersPlan(t, ns, "east", "north")
	e, logs = warmClusters(t, plan, dir, map[string]*rest.Config{"north": env.Config})
	a = e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
	if !slices.Equal(a.Values, []string{"e1:80", "e2:80", "e3:80"}) || !a.Clusters["east"].Stale || a.Clusters["north"].Synced || a.Synced {
		t.Fatalf("before Start, east's part alone, north not synced: %+v\n%s", a, logs)
	}
	if got := clusterLoads(e); got["east"] != "warm/" || got["north"] != "cold/missing" || len(got) != 2 {
		t.Errorf("loads: %v", got)
	}
	del(env.Kube.CoreV1().ConfigMaps(ns), "e1")
	run(t, e)
	expect(t, e, "app-to-addr", "shop", "e2:80", "e3:80")
	testenv.Eventually(t, "synced and fresh", func() string {
		a := e.Inspect().Answer(msync.KeyOf("app-to-addr", "shop"))
		if a.Stale || !a.Synced || !e.Ready() {
			return fmt.Sprintf("%+v ready=%v", a, e.Ready())
		}
		return ""
	})
	if got := relistsOf(e); got["east"] != 0 || got["north"] < 1 {
		t.Errorf("east must resume, north list: %v\n%s", got, logs)
	}
}

// onceOnly returns f, to be called once however often it is called.
func onceOnly(f func()) func() {
	done := false
	return func() {
		if !done {
			done = true
			f()
		}
	}
}
