package integration_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/iidp/metasync/internal/kubeapply"
	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

var sliceGVR = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}

// applyExample applies examples/appmodel files with every namespaced object
// moved to ns.
func applyExample(t *testing.T, ns string, files ...string) {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, f := range files {
		got, err := kubeapply.Objects(filepath.Join(testenv.Root(), "examples", "appmodel", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range got {
			if o.GetKind() == "Namespace" {
				continue
			}
			o.SetNamespace(ns)
			objs = append(objs, o)
		}
	}
	env.Namespace(t, ns)
	if err := kubeapply.Apply(context.Background(), env.Config, objs...); err != nil {
		t.Fatal(err)
	}
}

// exampleConfig loads examples/appmodel/config.yaml with its namespaces
// set to ns.
func exampleConfig(t *testing.T, ns string) *mschema.Config {
	t.Helper()
	cfg, err := mschema.Load(filepath.Join(testenv.Root(), "examples", "appmodel", "config.yaml"), mschema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Resources {
		cfg.Resources[i].Namespace = ns
	}
	return cfg
}

func expectChain(t *testing.T, e *msync.Engine, chain, key string, want ...string) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("Resolve(%q, %q) = %q", chain, key, want), func() string {
		got := e.Resolve(chain, key)
		if slices.Equal(got, want) {
			return ""
		}
		return fmt.Sprintf("%q", got)
	})
}

func patchSlice(t *testing.T, ns, name, endpoints string) {
	t.Helper()
	body := fmt.Sprintf(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":%q,"labels":{"kubernetes.io/service-name":"base"}},"addressType":"IPv4","endpoints":%s}`, name, endpoints)
	force := true
	_, err := env.Dynamic.Resource(sliceGVR).Namespace(ns).Patch(context.Background(), name, "application/apply-patch+yaml", []byte(body),
		metav1.PatchOptions{FieldManager: kubeapply.FieldManager, Force: &force})
	if err != nil {
		t.Fatal(err)
	}
}

// TestChainOverEndpointSlices resolves model -> app -> ready pod IPs merged
// over the three slices of a Service, and follows scaling.
func TestChainOverEndpointSlices(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	ns := "routing"
	applyExample(t, ns, "samples.yaml", "routing.yaml")
	cfg := exampleConfig(t, ns)
	// Serving endpoints, when configured, include terminating ones.
	cfg.Resources[1].Indexes = append(cfg.Resources[1].Indexes, mschema.Index{
		Name: "service-to-serving-addresses", Key: `metadata.labels.kubernetes\.io/service-name`,
		Value: `endpoints.#(conditions.serving==true)#.addresses|@flatten`,
	})
	e := startEngine(t, cfg)

	// Three slices merged, distinct, ready only (10.0.1.8 is not ready).
	if got, want := e.Resolve("model-to-addresses", "model1"), []string{"10.0.0.5", "10.0.0.6", "10.0.1.7", "10.0.2.9"}; !slices.Equal(got, want) {
		t.Fatalf("model1 -> %q, want %q", got, want)
	}
	if got := e.Resolve("model-to-addresses", "iiot_dataservice"); !slices.Equal(got, []string{"10.0.3.10"}) {
		t.Fatalf("iiot_dataservice -> %q", got)
	}
	if got := e.Lookup("service-to-serving-addresses", "base"); !slices.Equal(got, []string{"10.0.0.5", "10.0.0.6", "10.0.1.7", "10.0.1.8"}) {
		t.Fatalf("serving = %q (base-c sets no serving condition)", got)
	}

	// Scale down: a slice loses an endpoint; another slice is deleted.
	patchSlice(t, ns, "base-a", `[{"addresses":["10.0.0.5"],"conditions":{"ready":true}}]`)
	expectChain(t, e, "model-to-addresses", "model1", "10.0.0.5", "10.0.1.7", "10.0.2.9")
	remove(t, sliceGVR, ns, "base-c")
	// 10.0.0.5 was in base-c too, and stays through base-a.
	expectChain(t, e, "model-to-addresses", "model1", "10.0.0.5", "10.0.1.7")
	// A terminating endpoint turns ready again; a new slice appears.
	patchSlice(t, ns, "base-b", `[{"addresses":["10.0.1.7"],"conditions":{"ready":true}},{"addresses":["10.0.1.8"],"conditions":{"ready":true}}]`)
	patchSlice(t, ns, "base-d", `[{"addresses":["10.0.4.1"],"conditions":{"ready":true}}]`)
	expectChain(t, e, "model-to-addresses", "model1", "10.0.0.5", "10.0.1.7", "10.0.1.8", "10.0.4.1")
	// Every slice gone: nothing to call.
	for _, s := range []string{"base-a", "base-b", "base-d"} {
		remove(t, sliceGVR, ns, s)
	}
	expectChain(t, e, "model-to-addresses", "model1")
}

// TestAllNamespacesCompositeKeys runs a chain over all namespaces, keyed by
// namespace/name: app "a" of namespace x never gets the pods of Service "a"
// of namespace y.
func TestAllNamespacesCompositeKeys(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	for _, ns := range []string{"tenant-x", "tenant-y"} {
		env.Namespace(t, ns)
		apply(t, ns, "a", iidp, "model-"+ns, "shared-model")
		ip := map[string]string{"tenant-x": "10.1.0.1", "tenant-y": "10.2.0.1"}[ns]
		body := fmt.Sprintf(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"a-1","labels":{"kubernetes.io/service-name":"a"}},"addressType":"IPv4","endpoints":[{"addresses":[%q],"conditions":{"ready":true}}]}`, ip)
		force := true
		if _, err := env.Dynamic.Resource(sliceGVR).Namespace(ns).Patch(context.Background(), "a-1", "application/apply-patch+yaml", []byte(body),
			metav1.PatchOptions{FieldManager: kubeapply.FieldManager, Force: &force}); err != nil {
			t.Fatal(err)
		}
	}
	e := startEngine(t, &mschema.Config{
		Resources: []mschema.Resource{{
			Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels", LabelSelector: "iidp=iidp",
			Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "${metadata.namespace}/${metadata.name}"}},
		}, {
			Name: "endpointslices", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices", LabelSelector: "kubernetes.io/service-name",
			Indexes: []mschema.Index{{Name: "service-to-addresses",
				Key:   `${metadata.namespace}/${metadata.labels.kubernetes\.io/service-name}`,
				Value: `endpoints.#(conditions.ready==true)#.addresses|@flatten`}},
		}},
		Chains: []mschema.Chain{{Name: "model-to-addresses", Indexes: []string{"model-to-app", "service-to-addresses"}}},
	})
	if got := e.Resolve("model-to-addresses", "model-tenant-x"); !slices.Equal(got, []string{"10.1.0.1"}) {
		t.Fatalf("tenant-x -> %q", got)
	}
	if got := e.Resolve("model-to-addresses", "model-tenant-y"); !slices.Equal(got, []string{"10.2.0.1"}) {
		t.Fatalf("tenant-y -> %q", got)
	}
	if got := e.Lookup("model-to-app", "shared-model"); !slices.Equal(got, []string{"tenant-x/a", "tenant-y/a"}) {
		t.Fatalf("shared-model -> %q", got)
	}
	if got := e.Resolve("model-to-addresses", "shared-model"); !slices.Equal(got, []string{"10.1.0.1", "10.2.0.1"}) {
		t.Fatalf("shared-model -> %q", got)
	}
}

var gadgetCRD = testenv.LooseCRD("come.iidp.com", "Gadget", "gadgets")

var gadgetGVR = schema.GroupVersionResource{Group: "come.iidp.com", Version: "v1", Resource: "gadgets"}

func createGadget(t *testing.T, ns, name, color string) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "come.iidp.com/v1", "kind": "Gadget",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"color": color},
	}}
	if _, err := env.Dynamic.Resource(gadgetGVR).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create gadget %s: %v", name, err)
	}
}

func status(e *msync.Engine, name string) msync.ResourceStatus {
	for _, st := range e.Status() {
		if st.Name == name {
			return st
		}
	}
	return msync.ResourceStatus{}
}

// TestCRDsComeAndGo: a CRD missing at start leaves its entry waiting, not
// ready with the reason, while the others serve; it starts by itself when
// the CRD appears; a CRD deleted while watched clears the entry's keys and
// makes it not ready; it resumes when the CRD returns.
func TestCRDsComeAndGo(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	ns := "come-and-go"
	env.Namespace(t, ns)
	apply(t, ns, "app", iidp, "steady")
	plan, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{
		seedConfig(ns).Resources[0],
		{Name: "gadgets", Group: "come.iidp.com", Version: "v1", Resource: "gadgets", Namespace: ns,
			Indexes: []mschema.Index{{Name: "gadget-color", Key: "spec.color"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	e := runEngine(t, plan)

	testenv.Eventually(t, "gadgets waiting with a reason, appmodels serving", func() string {
		g, a := status(e, "gadgets"), status(e, "appmodels")
		if !g.Ready && strings.Contains(g.Reason, "could not find the requested resource") && a.Ready {
			return ""
		}
		return fmt.Sprintf("gadgets %+v, appmodels ready=%v", g, a.Ready)
	})
	expect(t, e, "model-to-app", "steady", "app")

	env.InstallCRD(t, gadgetCRD)
	createGadget(t, ns, "g1", "red")
	expect(t, e, "gadget-color", "red", ns+"/g1")
	testenv.Eventually(t, "gadgets ready", func() string {
		if g := status(e, "gadgets"); !g.Ready {
			return g.Reason
		}
		return ""
	})

	// The CRD is deleted while watched.
	crdClient := env.Dynamic.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if err := crdClient.Delete(context.Background(), "gadgets.come.iidp.com", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "gadget-color", "red")
	testenv.Eventually(t, "gadgets not ready after the CRD is deleted", func() string {
		if g := status(e, "gadgets"); !g.Ready && strings.Contains(g.Reason, "not served") {
			return ""
		}
		return fmt.Sprintf("%+v", status(e, "gadgets"))
	})
	if !status(e, "appmodels").Ready {
		t.Fatal("appmodels stopped serving")
	}
	testenv.Eventually(t, "the CRD is gone", func() string {
		if _, err := crdClient.Get(context.Background(), "gadgets.come.iidp.com", metav1.GetOptions{}); err == nil {
			return "still there"
		}
		return ""
	})

	// It returns.
	env.InstallCRD(t, gadgetCRD)
	createGadget(t, ns, "g2", "blue")
	expect(t, e, "gadget-color", "blue", ns+"/g2")
	expect(t, e, "gadget-color", "red")
	testenv.Eventually(t, "gadgets ready again", func() string {
		if g := status(e, "gadgets"); !g.Ready {
			return g.Reason
		}
		return ""
	})

}
