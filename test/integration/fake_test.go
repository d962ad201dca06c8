package integration_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/metasynctest"
	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// The test double of package metasynctest against a real engine on the
// real control plane (here, so that metasynctest's own tests need no
// control plane: see DEVELOPERS.md).

func appmodelConfig() string {
	return filepath.Join(testenv.Root(), "examples", "appmodel", "config.yaml")
}

// view is everything a Reader answers, for comparison.
type view struct {
	Indexes map[string]map[string][]string // index -> key -> values
	Chains  map[string]map[string][]string // chain -> key of its first index -> values
	Fields  map[string][]msync.ObjectFields
	Infos   []msync.IndexInfo
}

func read(t *testing.T, r msync.Reader, resources ...string) view {
	t.Helper()
	v := view{Indexes: map[string]map[string][]string{}, Chains: map[string]map[string][]string{}, Fields: map[string][]msync.ObjectFields{}, Infos: r.Indexes()}
	for _, ix := range v.Infos {
		v.Indexes[ix.Name] = map[string][]string{}
		for _, k := range r.Keys(ix.Name) {
			v.Indexes[ix.Name][k] = r.Lookup(ix.Name, k)
		}
	}
	for _, ch := range r.Chains() {
		v.Chains[ch.Name] = map[string][]string{}
		for _, k := range r.Keys(ch.Indexes[0]) {
			v.Chains[ch.Name][k] = r.Resolve(ch.Name, k)
		}
	}
	for _, res := range resources {
		fs, err := r.ResourceFields(res)
		if err != nil {
			t.Fatal(err)
		}
		v.Fields[res] = fs
	}
	return v
}

func dump(v view) string { b, _ := json.MarshalIndent(v, "", " "); return string(b) }

// TestAgreesWithTheEngine: on the same objects, the fake answers what a
// real engine on a real control plane answers, after applies, updates,
// deletes and objects that the selectors exclude.
func TestAgreesWithTheEngine(t *testing.T) {
	testenv.Need(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root := testenv.Root()
	env.InstallCRDFile(t, filepath.Join(root, "examples", "appmodel", "crd.yaml"))
	if err := kubeapply.Files(ctx, env.Config,
		filepath.Join(root, "examples", "appmodel", "samples.yaml"),
		filepath.Join(root, "examples", "appmodel", "routing.yaml")); err != nil {
		t.Fatal(err)
	}
	plan, err := mschema.LoadPlan(appmodelConfig(), mschema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	engine, err := msync.New(plan, env.Config, msync.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	engineCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = engine.Start(engineCtx); close(done) }()
	defer func() { stop(); <-done }()
	if err := engine.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(env.Config)
	gvrs := map[string]schema.GroupVersionResource{
		"appmodels":      {Group: "iidp.com", Version: "v1", Resource: "appmodels"},
		"endpointslices": {Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"},
	}
	// mirror gives the fake every object of the namespace, those that the
	// config's selectors exclude included: by Replace, or one by one.
	mirror := func(byReplace bool) {
		for res, gvr := range gvrs {
			list, err := dyn.Resource(gvr).Namespace("meta-test").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var docs []string
			for _, it := range list.Items {
				b, err := json.Marshal(it.Object)
				if err != nil {
					t.Fatal(err)
				}
				docs = append(docs, string(b))
			}
			if byReplace {
				err = fake.Replace(res, strings.Join(docs, "\n---\n"))
			} else {
				err = fake.Apply(res, strings.Join(docs, "\n---\n"))
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// agree waits (the engine follows the cluster) until both answer the same.
	agree := func(step string) {
		t.Helper()
		var got, want view
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			got, want = read(t, fake, "appmodels"), read(t, engine, "appmodels")
			if reflect.DeepEqual(got, want) {
				return
			}
		}
		t.Fatalf("%s: the fake and the engine differ\nfake:   %s\nengine: %s", step, dump(got), dump(want))
	}
	mirror(true)
	agree("initial objects")
	if n := len(read(t, engine).Indexes["model-to-app"]); n < 3 {
		t.Fatalf("the samples give %d models, want at least 3", n)
	}

	appModels := dyn.Resource(gvrs["appmodels"]).Namespace("meta-test")
	apply := func(name string, labels map[string]any, models ...string) {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "iidp.com/v1", "kind": "AppModel",
			"metadata": map[string]any{"name": name, "labels": labels},
			"spec":     map[string]any{"type": "model", "version": "9", "models": models},
		}}
		if _, err := appModels.Apply(ctx, name, obj, metav1.ApplyOptions{FieldManager: "agree-test", Force: true}); err != nil {
			t.Fatal(err)
		}
	}
	selected := map[string]any{"iidp": "iidp"}
	apply("agree-a", selected, "model1", "agree-only")
	apply("agree-stray", map[string]any{"other": "x"}, "stray-model")
	mirror(false)
	agree("after an add and an excluded object")

	apply("agree-a", map[string]any{"other": "x"}, "model1") // no longer selected
	if err := dyn.Resource(gvrs["endpointslices"]).Namespace("meta-test").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	mirror(false) // what stopped matching goes; deletes need Replace:
	mirror(true)
	agree("after a label change and deletes")
}
