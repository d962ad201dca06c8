// Package deploy_test proves the shipped manifests on a real apiserver:
// they render with kustomize and pass a server-side dry run, and the
// engine syncs with exactly the shipped RBAC while a write is denied.
package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainLeakChecked(m, &env) }

// render builds a kustomization the way `kubectl kustomize` does.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatal(err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// apply applies objects with server-side apply; dryRun asks the apiserver
// to validate and admit them without storing them.
func apply(t *testing.T, cfg *rest.Config, objs []*unstructured.Unstructured, dryRun bool) {
	t.Helper()
	dc := discovery.NewDiscoveryClientForConfigOrDie(cfg)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn := dynamic.NewForConfigOrDie(cfg)
	opts := metav1.ApplyOptions{FieldManager: "deploy-test", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, u.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		if _, err := ri.Apply(context.Background(), u.GetName(), u, opts); err != nil {
			t.Fatalf("apply %s %s/%s (dry run %v): %v", gvk.Kind, u.GetNamespace(), u.GetName(), dryRun, err)
		}
	}
}

func TestManifestsPassServerSideDryRun(t *testing.T) {
	testenv.Need(t, env)
	env.Namespace(t, "meta-test")
	env.Namespace(t, "metasync")
	for _, dir := range []string{"base", "overlays/daemonset", "overlays/cluster-wide"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
				if o.GetKind() == "Deployment" || o.GetKind() == "DaemonSet" {
					checkHardened(t, o)
				}
			}
			switch dir {
			case "overlays/daemonset":
				if kinds["DaemonSet"] != 1 || kinds["Deployment"] != 0 {
					t.Fatalf("kinds = %v", kinds)
				}
			case "overlays/cluster-wide":
				// The Role left is the one that reads the cluster's ID.
				if kinds["ClusterRole"] != 2 || kinds["Role"] != 1 {
					t.Fatalf("kinds = %v", kinds)
				}
			default:
				if kinds["Deployment"] != 1 || kinds["Role"] != 2 || kinds["ConfigMap"] != 1 {
					t.Fatalf("kinds = %v", kinds)
				}
			}
			apply(t, env.Config, objs, true)
		})
	}
}

// checkHardened checks the pod template's security settings and probes.
func checkHardened(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	spec, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
	if v, _, _ := unstructured.NestedBool(spec, "securityContext", "runAsNonRoot"); !v {
		t.Errorf("%s: runAsNonRoot not set", o.GetKind())
	}
	if v, _, _ := unstructured.NestedString(spec, "securityContext", "seccompProfile", "type"); v != "RuntimeDefault" {
		t.Errorf("%s: seccomp %q", o.GetKind(), v)
	}
	containers, _, _ := unstructured.NestedSlice(spec, "containers")
	for _, c := range containers {
		c := c.(map[string]any)
		sc, _ := c["securityContext"].(map[string]any)
		if sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false {
			t.Errorf("%s: container securityContext %v", o.GetKind(), sc)
		}
		if drop, _, _ := unstructured.NestedStringSlice(sc, "capabilities", "drop"); len(drop) != 1 || drop[0] != "ALL" {
			t.Errorf("%s: capabilities drop %v", o.GetKind(), drop)
		}
		for _, probe := range []string{"readinessProbe", "livenessProbe"} {
			if _, ok := c[probe]; !ok {
				t.Errorf("%s: no %s", o.GetKind(), probe)
			}
		}
		if _, ok, _ := unstructured.NestedMap(c, "resources", "requests"); !ok {
			t.Errorf("%s: no resource requests", o.GetKind())
		}
	}
}

// TestEngineRunsWithShippedRBAC applies the base's RBAC for real, then runs
// the engine impersonating the shipped ServiceAccount, with the shipped
// config: it syncs, and a write as that account is denied.
func TestEngineRunsWithShippedRBAC(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, "meta-test")
	env.Namespace(t, "metasync")
	var rbac []*unstructured.Unstructured
	for _, o := range render(t, "base") {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
			rbac = append(rbac, o)
		}
	}
	apply(t, env.Config, rbac, false)

	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:metasync:metasync",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:metasync", "system:authenticated"},
	}
	c, err := mschema.Load("base/app/config.yaml", mschema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := mschema.Compile(c)
	if err != nil {
		t.Fatal(err)
	}
	e, err := msync.New(plan, cfg, msync.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Start(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatalf("the engine does not sync with the shipped RBAC: %v", err)
	}

	dyn := dynamic.NewForConfigOrDie(cfg)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "iidp.com/v1", "kind": "AppModel",
		"metadata": map[string]any{"name": "intruder"},
		"spec":     map[string]any{"models": []any{"x"}},
	}}
	_, err = dyn.Resource(schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}).Namespace("meta-test").
		Create(context.Background(), obj, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("a write as metasync's ServiceAccount: %v, want Forbidden", err)
	}
	// And nothing beyond the watched namespace.
	_, err = dyn.Resource(schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}).Namespace("default").
		List(context.Background(), metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("a list in another namespace: %v, want Forbidden", err)
	}
}
