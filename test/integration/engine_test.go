// Package integration_test holds the tests of package sync that need a real
// control plane (envtest, through test/testenv). They live here, not in
// sync/, so that a library user's go mod tidy, which loads the tests of the
// packages it imports, does not pull envtest's modules (controller-runtime,
// etcd, prometheus, grpc, zap) into the user's go.sum. They use only sync's
// exported API.
package integration_test

import (
	"context"
	"fmt"
	"log/slog"

	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"

	"github.com/iidp/metasync/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainLeakChecked(m, &env) }

var appModelGVR = schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}

// AppModelFields is the typed view of an AppModel's projected fields.
type AppModelFields struct {
	Type    string   `json:"type"`
	Version string   `json:"version"`
	Models  []string `json:"models"`
}

// apply writes an AppModel the way the seed does: server-side apply with a
// field manager and force.
func apply(t *testing.T, ns, name string, labels map[string]any, models ...any) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "iidp.com/v1",
		"kind":       "AppModel",
		"metadata":   map[string]any{"name": name, "labels": labels},
		"spec":       map[string]any{"type": "model", "version": "1.7", "models": models},
	}}
	_, err := env.Dynamic.Resource(appModelGVR).Namespace(ns).Apply(context.Background(), name, obj,
		metav1.ApplyOptions{FieldManager: "appmodels-manager", Force: true})
	if err != nil {
		t.Fatalf("apply %s/%s: %v", ns, name, err)
	}
}

func remove(t *testing.T, gvr schema.GroupVersionResource, ns, name string) {
	t.Helper()
	err := env.Dynamic.Resource(gvr).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete %s/%s: %v", ns, name, err)
	}
}

var iidp = map[string]any{"iidp": "iidp"}

// runEngine starts an engine for plan on the test control plane; the
// test's cleanup stops it and checks that Start returned cleanly.
func runEngine(t *testing.T, plan *mschema.Plan) *msync.Engine {
	t.Helper()
	return runEngineWith(t, plan, env.Config, msync.Options{})
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startEngine compiles cfg, starts an engine and waits for its sync.
func startEngine(t *testing.T, cfg *mschema.Config) *msync.Engine {
	t.Helper()
	plan, err := mschema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := runEngine(t, plan)
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	return e
}

func seedConfig(ns string) *mschema.Config {
	return &mschema.Config{Resources: []mschema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Namespace: ns, LabelSelector: "iidp=iidp", Resync: 300 * time.Second,
		Fields:  map[string]string{"type": "spec.type", "version": "spec.version", "models": "spec.models"},
		Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}}
}

func expect(t *testing.T, e *msync.Engine, index, key string, want ...string) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("Lookup(%q, %q) = %q", index, key, want), func() string {
		got := e.Lookup(index, key)
		if slices.Equal(got, want) {
			return ""
		}
		return fmt.Sprintf("%q", got)
	})
}

func TestSeedScenario(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, "meta-test")
	env.Namespace(t, "meta-other")

	apply(t, "meta-test", "base", iidp, "model1", "model2", "model3")
	apply(t, "meta-test", "unlabelled", nil, "model-unlabelled")
	apply(t, "meta-other", "elsewhere", iidp, "model-elsewhere")
	t.Cleanup(func() {
		for _, n := range []string{"base", "unlabelled", "iiot"} {
			remove(t, appModelGVR, "meta-test", n)
		}
		remove(t, appModelGVR, "meta-other", "elsewhere")
	})

	e := startEngine(t, seedConfig("meta-test"))

	// Right after WaitForSync, with no waiting.
	if got := e.Lookup("model-to-app", "model2"); !slices.Equal(got, []string{"base"}) {
		t.Fatalf(`Lookup("model-to-app", "model2") = %q, want ["base"]`, got)
	}
	if got := e.Keys("model-to-app"); !slices.Equal(got, []string{"model1", "model2", "model3"}) {
		t.Fatalf("keys = %q: the unlabelled object and the other namespace must not be indexed", got)
	}

	// Typed access to the projected fields of the objects behind a key.
	objs, err := msync.Objects[AppModelFields](e, "model-to-app", "model2")
	if err != nil {
		t.Fatal(err)
	}
	want := AppModelFields{Type: "model", Version: "1.7", Models: []string{"model1", "model2", "model3"}}
	if len(objs) != 1 || objs[0].Type != want.Type || objs[0].Version != want.Version || !slices.Equal(objs[0].Models, want.Models) {
		t.Fatalf("Objects = %+v, want [%+v]", objs, want)
	}
	one, found, err := msync.Object[AppModelFields](e, "appmodels", "meta-test/base")
	if err != nil || !found || one.Version != "1.7" {
		t.Fatalf("Object = %+v %v %v", one, found, err)
	}

	// Add a model, remove one, rename one: the index follows.
	apply(t, "meta-test", "base", iidp, "model2-renamed", "model3", "model4")
	expect(t, e, "model-to-app", "model4", "base")
	expect(t, e, "model-to-app", "model2-renamed", "base")
	expect(t, e, "model-to-app", "model1")
	expect(t, e, "model-to-app", "model2")
	if got := e.Keys("model-to-app"); !slices.Equal(got, []string{"model2-renamed", "model3", "model4"}) {
		t.Fatalf("keys after the update = %q", got)
	}

	// Two apps that claim one model: both, sorted.
	apply(t, "meta-test", "iiot", iidp, "model3", "iiot_dataservice")
	expect(t, e, "model-to-app", "model3", "base", "iiot")
	objs, err = msync.Objects[AppModelFields](e, "model-to-app", "model3")
	if err != nil || len(objs) != 2 {
		t.Fatalf("Objects(model3) = %+v, %v", objs, err)
	}

	// The label removed: the object leaves the index; put back: it returns.
	apply(t, "meta-test", "iiot", map[string]any{"iidp": "other"}, "model3", "iiot_dataservice")
	expect(t, e, "model-to-app", "model3", "base")
	expect(t, e, "model-to-app", "iiot_dataservice")
	apply(t, "meta-test", "iiot", iidp, "model3", "iiot_dataservice")
	expect(t, e, "model-to-app", "iiot_dataservice", "iiot")

	// Delete: its keys are gone.
	remove(t, appModelGVR, "meta-test", "base")
	expect(t, e, "model-to-app", "model4")
	expect(t, e, "model-to-app", "model3", "iiot")
	if got := e.Keys("model-to-app"); !slices.Equal(got, []string{"iiot_dataservice", "model3"}) {
		t.Fatalf("keys after delete = %q", got)
	}

	// Delete and recreate under the same name: the new object's models only.
	uidBefore := getUID(t, "meta-test", "iiot")
	remove(t, appModelGVR, "meta-test", "iiot")
	apply(t, "meta-test", "iiot", iidp, "model9")
	if getUID(t, "meta-test", "iiot") == uidBefore {
		t.Fatal("recreate kept the UID")
	}
	expect(t, e, "model-to-app", "model9", "iiot")
	expect(t, e, "model-to-app", "model3")

	st := e.Status()[0]
	if !st.Synced || st.Objects != 1 || st.Error != "" || st.Relists < 1 {
		t.Fatalf("status = %+v", st)
	}
}

func getUID(t *testing.T, ns, name string) types.UID {
	t.Helper()
	u, err := env.Dynamic.Resource(appModelGVR).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return u.GetUID()
}

var looseCRD = testenv.LooseCRD("test.iidp.com", "LooseModel", "loosemodels")

var looseGVR = schema.GroupVersionResource{Group: "test.iidp.com", Version: "v1", Resource: "loosemodels"}

func createLoose(t *testing.T, ns, name string, models any) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.iidp.com/v1", "kind": "LooseModel",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"models": models},
	}}
	if _, err := env.Dynamic.Resource(looseGVR).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
}

// TestOddShapesAreCountedNotFatal feeds objects whose spec.models is an
// object, a number, or an array holding an object, before and after the
// sync: bad ones are counted as rule errors, the rest are indexed, and the
// watch keeps running.
func TestOddShapesAreCountedNotFatal(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRD(t, looseCRD)
	ns := "loose"
	env.Namespace(t, ns)
	createLoose(t, ns, "good", []any{"a", "b"})
	createLoose(t, ns, "object", map[string]any{"x": "y"})
	createLoose(t, ns, "number", 42)

	e := startEngine(t, &mschema.Config{Resources: []mschema.Resource{{
		Name: "loose", Group: "test.iidp.com", Version: "v1", Resource: "loosemodels", Namespace: ns,
		Indexes: []mschema.Index{{Name: "loose-model", Key: "spec.models"}},
	}}})
	if got := e.Keys("loose-model"); !slices.Equal(got, []string{"42", "a", "b"}) {
		t.Fatalf("keys = %q", got)
	}
	if got := e.Lookup("loose-model", "a"); !slices.Equal(got, []string{"loose/good"}) {
		t.Fatalf("a = %q", got)
	}
	if n := e.Status()[0].RuleErrors["loose-model"]; n != 1 {
		t.Fatalf("rule errors after sync = %d, want 1", n)
	}

	// A bad object arriving by watch is counted too, and the watch goes on.
	createLoose(t, ns, "mixed", []any{"c", map[string]any{"d": 1}})
	createLoose(t, ns, "later", []any{"e"})
	expect(t, e, "loose-model", "e", "loose/later")
	if got := e.Lookup("loose-model", "c"); got != nil {
		t.Fatalf("an object with a bad element contributed %q", got)
	}
	if n := e.Status()[0].RuleErrors["loose-model"]; n != 2 {
		t.Fatalf("rule errors = %d, want 2", n)
	}
	if st := e.Status()[0]; st.Objects != 5 {
		t.Fatalf("objects = %d, want 5 (bad objects are kept, without entries)", st.Objects)
	}
}

// TestConcurrentReadersDuringWatch reads from many goroutines while the
// watch applies updates (run under -race).
func TestConcurrentReadersDuringWatch(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	ns := "meta-readers"
	env.Namespace(t, ns)
	apply(t, ns, "app", iidp, "m0")
	e := startEngine(t, seedConfig(ns))
	ctx, cancel := context.WithCancel(context.Background())
	var wg gosync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				for _, v := range e.Lookup("model-to-app", "m0") {
					if v != "app" {
						t.Errorf("unexpected value %q", v)
					}
				}
				_ = e.Keys("model-to-app")
			}
		})
	}
	for i := range 20 {
		apply(t, ns, "app", iidp, "m0", fmt.Sprintf("m%d", i+1))
	}
	expect(t, e, "model-to-app", "m20", "app")
	cancel()
	wg.Wait()
}

func TestWaitForSyncNamesTheMissingResource(t *testing.T) {
	testenv.Need(t, env)
	plan, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{
		Name: "ghosts", Group: "nothere.iidp.com", Version: "v1", Resource: "ghosts",
		Indexes: []mschema.Index{{Name: "ghost", Key: "spec.x"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	e := runEngine(t, plan)
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer wcancel()
	err = e.WaitForSync(wctx)
	if err == nil || !strings.Contains(err.Error(), "ghosts (list: the server could not find the requested resource") {
		t.Fatalf("WaitForSync = %v", err)
	}
	if e.Inspect().Synced() {
		t.Fatal("Synced() with a missing resource")
	}
}

func TestResyncRelists(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	ns := "meta-resync"
	env.Namespace(t, ns)
	apply(t, ns, "app", iidp, "r1")
	cfg := seedConfig(ns)
	cfg.Resources[0].Resync = 500 * time.Millisecond
	e := startEngine(t, cfg)
	testenv.Eventually(t, "relists >= 3", func() string {
		if n := e.Status()[0].Relists; n < 3 {
			return fmt.Sprintf("%d relists", n)
		}
		return ""
	})
	apply(t, ns, "app", iidp, "r2")
	expect(t, e, "model-to-app", "r2", "app")
	expect(t, e, "model-to-app", "r1")
}
