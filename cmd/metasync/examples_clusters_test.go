package main_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// applyIn applies manifests to e with server-side apply.
func applyIn(t *testing.T, e *testenv.Env, objs ...map[string]any) {
	t.Helper()
	var us []*unstructured.Unstructured
	for _, o := range objs {
		us = append(us, &unstructured.Unstructured{Object: o})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kubeapply.Apply(ctx, e.Config, us...); err != nil {
		t.Fatal(err)
	}
}

// clustersExample writes examples/clusters/config.yaml as it is, but for
// west's kubeconfig: west's, whose context is the one the config names
// (west-reader); it returns its path.
func clustersExample(t *testing.T, west *testenv.Env) string {
	t.Helper()
	body, err := os.ReadFile(filepath.Join(testenv.Root(), "examples", "clusters", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(west.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	kc.Contexts["west-reader"] = kc.Contexts[kc.CurrentContext]
	delete(kc.Contexts, kc.CurrentContext)
	kc.CurrentContext = "west-reader"
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "west.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	const mounted = "kubeconfig: /etc/metasync/clusters/west/kubeconfig\n"
	if !strings.Contains(string(body), mounted) || !strings.Contains(string(body), "context: west-reader") {
		t.Fatalf("examples/clusters/config.yaml has no %q with context west-reader: adapt the test", mounted)
	}
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte(strings.Replace(string(body), mounted, "kubeconfig: "+kubeconfig+"\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return config
}

// TestServeClustersExample serves examples/clusters/config.yaml on two
// real control planes: east (the daemon's own connection, with the
// AppModels) and west (its kubeconfig file). The chain answers the
// endpoints of the model's app in both clusters, each cluster's state
// beside; ?cluster=west narrows it to west's; a Service of the same name
// in another namespace never mixes in. `validate --cluster` calls the
// example valid without a warning, and warns of the same config whose
// service-to-endpoints is keyed by the Service's name alone.
func TestServeClustersExample(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = west.Stop() })
	const ns, other = "clusters-example", "clusters-example-other"
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	for _, e := range []*testenv.Env{env, west} {
		e.Namespace(t, ns)
		e.Namespace(t, other)
	}
	applyIn(t, env, appModel(ns, "base", "example-model"), slice(ns, "base-east", "base", []string{"10.0.0.5"}),
		slice(other, "base-elsewhere", "base", []string{"10.9.9.1"}))
	applyIn(t, west, slice(ns, "base-west", "base", []string{"10.1.0.7"}),
		slice(other, "base-elsewhere", "base", []string{"10.9.9.2"}))

	config := clustersExample(t, west)
	eastKubeconfig := env.WriteKubeconfig(t, "")
	addr := testenv.FreeAddr(t)
	d := start(t, nil, "--config", config, "--kubeconfig", eastKubeconfig, "--listen", addr)
	waitHTTP(t, d, addr)
	chain := "http://" + addr + "/v1/chains/model-to-endpoints/keys/example-model"
	testenv.Eventually(t, "the chain's answer from both clusters", func() string {
		if a := call(t, "GET", chain); strings.TrimSpace(a.raw) != `{"chain":"model-to-endpoints","key":"example-model","values":["10.0.0.5:8080","10.1.0.7:8080"],"clusters":{"east":{"synced":true,"stale":false},"west":{"synced":true,"stale":false}}}` {
			return a.raw
		}
		return ""
	})
	if a := call(t, "GET", chain+"?cluster=west"); strings.TrimSpace(a.raw) != `{"chain":"model-to-endpoints","key":"example-model","values":["10.1.0.7:8080"],"clusters":{"west":{"synced":true,"stale":false}}}` {
		t.Fatalf("narrowed to west: %d %s", a.code, a.raw)
	}
	if a := call(t, "GET", "http://"+addr+"/v1/indexes/model-to-app/keys/example-model"); !strings.Contains(a.raw, `"values":["`+ns+`/base"]`) {
		t.Fatalf("model-to-app: %d %s", a.code, a.raw)
	}
	if a := call(t, "GET", "http://"+addr+"/readyz"); a.code != 200 {
		t.Fatalf("/readyz: %d %s", a.code, a.raw)
	}

	out, errOut, code := metasync(t, "validate", "--cluster", "--config", config, "--kubeconfig", eastKubeconfig)
	if code != 0 || strings.Contains(out, "warning:") || strings.Contains(out, "chain model-to-endpoints") || !strings.Contains(out, ": valid: ") {
		t.Fatalf("validate --cluster of the example: exit %d\n%s%s", code, out, errOut)
	}
	body, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	const keyed = `key: '${metadata.namespace}/${metadata.labels.kubernetes\.io/service-name}'`
	if !strings.Contains(string(body), keyed) {
		t.Fatalf("the example has no %s: adapt the test", keyed)
	}
	bare := filepath.Join(filepath.Dir(config), "bare.yaml")
	if err := os.WriteFile(bare, []byte(strings.Replace(string(body), keyed, `key: 'metadata.labels.kubernetes\.io/service-name'`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = metasync(t, "validate", "--cluster", "--config", bare, "--kubeconfig", eastKubeconfig)
	const want = `warning: chains[0].indexes[1]: chain model-to-endpoints: step 1 (model-to-app) gives namespace/name values (no value: set: the object key of appmodels, which the cluster serves namespaced) but index service-to-endpoints is keyed by a bare name (key: metadata.labels.kubernetes\.io/service-name): the chain answers [] for every key; set value: metadata.name on model-to-app, or key service-to-endpoints by namespace/name (key: '${metadata.namespace}/${metadata.labels.kubernetes\.io/service-name}')` + "\n"
	if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, ": valid: ") {
		t.Fatalf("validate --cluster of a chain keyed by the name alone: exit %d, want 0 and\n%s\ngot:\n%s%s", code, want, out, errOut)
	}
}
