package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/schema/cluster"
)

// exampleConfigs returns every metasync config under examples/: each
// YAML file with a top-level resources: list.
func exampleConfigs(t *testing.T) []string {
	t.Helper()
	var out []string
	top := regexp.MustCompile(`(?m)^resources:`)
	err := filepath.WalkDir(filepath.Join("..", "..", "examples"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		b, err := os.ReadFile(path)
		if err == nil && top.Match(b) {
			out = append(out, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// withClusterKubeconfigs returns config as validate can read it here: a
// copy in a folder of the test's whose clusters' kubeconfig files (which
// the example puts where a deployment mounts them) are kubeconfigs of
// the test's, each with the context the config names; config itself
// when no cluster names a kubeconfig.
func withClusterKubeconfigs(t *testing.T, config string) string {
	t.Helper()
	c, err := schema.Load(config, schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	dir, text, changed := t.TempDir(), string(body), false
	for _, cl := range c.Clusters {
		if cl.Kubeconfig == "" {
			continue
		}
		if len(c.CRDs) > 0 {
			t.Fatalf("%s: a copy of a config with crds: would not find them: adapt the test", config)
		}
		context := cl.Context
		if context == "" {
			context = "default"
		}
		kc := clientcmdapi.NewConfig()
		kc.Clusters[cl.Name] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
		kc.AuthInfos[cl.Name] = &clientcmdapi.AuthInfo{Token: "unused"}
		kc.Contexts[context] = &clientcmdapi.Context{Cluster: cl.Name, AuthInfo: cl.Name}
		kc.CurrentContext = context
		path := filepath.Join(dir, cl.Name+".kubeconfig")
		if err := clientcmd.WriteToFile(*kc, path); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text, "kubeconfig: "+cl.Kubeconfig+"\n") {
			t.Fatalf("%s: no line \"kubeconfig: %s\" to point at a test kubeconfig", config, cl.Kubeconfig)
		}
		text, changed = strings.Replace(text, "kubeconfig: "+cl.Kubeconfig+"\n", "kubeconfig: "+path+"\n", 1), true
	}
	if !changed {
		return config
	}
	path := filepath.Join(dir, filepath.Base(config))
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestExampleConfigsValidate: every metasync config under examples/ is
// valid as `metasync validate` says it (exit 0, no warning: no chain
// whose steps' shapes disagree, which would answer [] for every key),
// and, checked against the examples' CRD files, every path is in the
// CRD's schema and every chain step's shape is known and agrees.
// examples/clusters is also served on two control planes
// (TestServeClustersExample), examples/appmodel and examples/custom-crd
// on one (TestServeEndToEnd, TestCustomCRDReadme).
func TestExampleConfigsValidate(t *testing.T) {
	configs := exampleConfigs(t)
	var names []string
	for _, c := range configs {
		names = append(names, filepath.ToSlash(strings.TrimPrefix(c, filepath.Join("..", "..")+string(filepath.Separator))))
	}
	for _, want := range []string{"examples/appmodel/config.yaml", "examples/clusters/config.yaml", "examples/custom-crd/config.yaml"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s is not among the example configs found: %q", want, names)
		}
	}
	files, _ := filepath.Glob(filepath.Join("..", "..", "examples", "*", "crd.yaml"))
	crds, err := cluster.ReadCRDs(files)
	if err != nil || len(crds) < 2 {
		t.Fatalf("the examples' CRDs %q: %d, %v", files, len(crds), err)
	}
	for i, config := range configs {
		t.Run(names[i], func(t *testing.T) {
			path := withClusterKubeconfigs(t, config)
			out, errOut, code := cli("validate", path)
			if code != 0 || errOut != "" || strings.Contains(out, "warning:") || !strings.Contains(out, path+": valid: ") {
				t.Fatalf("validate %s: exit %d\n%s%s", names[i], code, out, errOut)
			}
			plan, err := schema.LoadPlan(path, schema.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if notes, err := cluster.CheckPaths(plan, crds); err != nil {
				t.Errorf("paths against the examples' CRDs: %v (notes %q)", err, notes)
			}
			if warnings, notes := cluster.Advise(plan, crds, nil); len(warnings) > 0 || len(notes) > 0 {
				t.Errorf("with the examples' CRDs: warnings %q, notes %q", warnings, notes)
			}
		})
	}
}
