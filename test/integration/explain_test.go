package integration_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// rvOf reads an AppModel's resourceVersion from the apiserver.
func rvOf(t *testing.T, ns, name string) string {
	t.Helper()
	o, err := env.Dynamic.Resource(appModelGVR).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return o.GetResourceVersion()
}

// claimants returns the first step's objects of an explained lookup as
// "key@rv" with a * on the chosen one.
func claimants(x msync.Explanation) []string {
	var out []string
	for _, o := range x.Steps[0].Objects {
		s := o.Key + "@" + o.ResourceVersion
		if o.Chosen {
			s += "*"
		}
		out = append(out, s)
	}
	return out
}

// TestExplainAndUniqueOnTheControlPlane: on the reference setup (where
// model-to-app is unique), two AppModels claim model1: the older answers,
// although its name sorts after the other's; explain names both, with the
// resourceVersions the apiserver gives them, and marks the older; the
// conflict is counted, in the metric and /readyz?verbose. A move, the
// older's return and its delete hand the key over without a mix. The same
// answers after a warm start from a snapshot and across reloads that turn
// unique off and on; a chain is explained step by step over HTTP; a step
// whose resource is not synced says so.
func TestExplainAndUniqueOnTheControlPlane(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "explain-unique"
	env.Namespace(t, ns)
	apply(t, ns, "zeta", iidp, "model1", "model2")
	// creationTimestamp counts seconds: the second claimant is younger.
	time.Sleep(1100 * time.Millisecond)
	apply(t, ns, "alpha", iidp, "model1")
	applySlice(t, ns, "zeta-a", "zeta", 8080, ep{addr: "10.7.0.1", ready: yes})
	applySlice(t, ns, "alpha-a", "alpha", 8080, ep{addr: "10.7.0.2", ready: yes})

	cfg := exampleConfig(t, ns)
	plan, err := mschema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e := runEngineWith(t, plan, env.Config, msync.Options{SnapshotDir: dir, SnapshotInterval: time.Hour})
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	expectLookup := func(key string, want ...string) {
		t.Helper()
		testenv.Eventually(t, fmt.Sprintf("model-to-app %s = %v", key, want), func() string {
			if got := e.Lookup("model-to-app", key); !slices.Equal(got, want) {
				return fmt.Sprint(got)
			}
			return ""
		})
	}
	expectLookup("model1", "zeta")
	expectChain(t, e, "model-to-addresses", "model1", "10.7.0.1")
	zetaRV, alphaRV := rvOf(t, ns, "zeta"), rvOf(t, ns, "alpha")
	x := e.Explain(msync.KeyOf("model-to-app", "model1"))
	if want := []string{ns + "/zeta@" + zetaRV + "*", ns + "/alpha@" + alphaRV}; !slices.Equal(claimants(x), want) {
		t.Fatalf("claimants %v, want %v", claimants(x), want)
	}
	if c := e.Inspect().Conflicts(); len(c) != 1 || !slices.Equal(c[0].Keys, []string{"model1"}) {
		t.Fatalf("Conflicts = %+v", c)
	}

	// Over HTTP (the metric, /readyz?verbose, an explained chain): the
	// daemon's TestDaemonExplainsAndNarrows in cmd/metasync.

	// zeta lets go of model1: alpha answers, no conflict.
	apply(t, ns, "zeta", iidp, "model2")
	expectLookup("model1", "alpha")
	expectChain(t, e, "model-to-addresses", "model1", "10.7.0.2")
	if c := e.Inspect().Conflicts(); len(c) != 0 {
		t.Fatalf("Conflicts = %+v once zeta let go", c)
	}
	// zeta, older, claims it again: zeta answers.
	apply(t, ns, "zeta", iidp, "model1", "model2")
	expectLookup("model1", "zeta")

	// A warm start: an engine from the snapshot, never started (so never
	// caught up), answers and explains as the snapshot holds it.
	f, err := os.Create(filepath.Join(dir, msync.SnapshotFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Inspect().WriteSnapshot(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	cold, _ := warm(t, env.Config, plan, dir)
	if st := cold.Inspect().SnapshotStatus(); st.Load != "warm" {
		t.Fatalf("not a warm start: %+v", st)
	}
	if got := cold.Lookup("model-to-app", "model1"); !slices.Equal(got, []string{"zeta"}) {
		t.Fatalf("warm start: model1 = %v, want [zeta]", got)
	}
	x = cold.Explain(msync.KeyOf("model-to-app", "model1"))
	if want := []string{ns + "/zeta@" + rvOf(t, ns, "zeta") + "*", ns + "/alpha@" + alphaRV}; !slices.Equal(claimants(x), want) || !x.Stale {
		t.Fatalf("warm start: claimants %v (stale %v), want %v", claimants(x), x.Stale, want)
	}
	if c := cold.Inspect().Conflicts(); len(c) != 1 {
		t.Fatalf("warm start: Conflicts = %+v", c)
	}

	// Reloads: unique off answers both; on again, the oldest.
	off := exampleConfig(t, ns)
	for i := range off.Resources[0].Indexes {
		off.Resources[0].Indexes[i].Unique = false
	}
	offPlan, err := mschema.Compile(off)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := e.Reload(offPlan); err != nil || !slices.Equal(ch.Unique, []string{"model-to-app"}) || len(ch.Restart) != 0 {
		t.Fatalf("reload: %+v, %v", ch, err)
	}
	if got := e.Lookup("model-to-app", "model1"); !slices.Equal(got, []string{"alpha", "zeta"}) {
		t.Fatalf("unique off: model1 = %v", got)
	}
	if c := e.Inspect().Conflicts(); len(c) != 0 {
		t.Fatalf("unique off: Conflicts = %+v", c)
	}
	if _, err := e.Reload(plan); err != nil {
		t.Fatal(err)
	}
	if got := e.Lookup("model-to-app", "model1"); !slices.Equal(got, []string{"zeta"}) {
		t.Fatalf("unique on again: model1 = %v", got)
	}

	// zeta deleted: alpha answers, no conflict.
	remove(t, appModelGVR, ns, "zeta")
	expectLookup("model1", "alpha")
	if c := e.Inspect().Conflicts(); len(c) != 0 {
		t.Fatalf("Conflicts = %+v once zeta is gone", c)
	}
	x = e.Explain(msync.ChainOf("model-to-addresses", "model1"))
	if len(x.Steps) != 2 || len(x.Steps[0].Objects) != 1 || x.Steps[0].Objects[0].Key != ns+"/alpha" || x.Steps[0].Objects[0].Chosen {
		t.Fatalf("after the delete: %+v", x)
	}

	// A step whose resource is not synced: its slices are of a resource
	// that does not exist.
	bad := exampleConfig(t, ns)
	for i := range bad.Resources {
		if bad.Resources[i].Name == "endpointslices" {
			bad.Resources[i].Group = "nowhere.example.com"
		}
	}
	badPlan, err := mschema.Compile(bad)
	if err != nil {
		t.Fatal(err)
	}
	b := runEngine(t, badPlan)
	testenv.Eventually(t, "appmodels synced", func() string {
		if !b.Inspect().IndexSynced("model-to-app") {
			return "not yet"
		}
		return ""
	})
	x = b.Explain(msync.ChainOf("model-to-addresses", "model1"))
	if len(x.Steps) != 2 || x.Steps[1].Synced || x.Steps[1].Empty != msync.ExplainNotSynced || x.Synced {
		t.Fatalf("a step not synced: %+v", x)
	}
}
