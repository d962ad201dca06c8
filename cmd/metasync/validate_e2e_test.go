package main_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

func TestValidate(t *testing.T) {
	good := filepath.Join(testenv.Root(), "examples", "appmodel", "config.yaml")
	out, _, code := metasync(t, "validate", "--config", good)
	// Offline, the AppModel paths cannot be checked (its CRD is not under
	// crds:): validate says so, and where they are checked.
	if code != 0 || !strings.HasSuffix(out, "valid: 2 resources, 3 indexes, 2 chains (paths of 1 resource not checked: see the note; --cluster checks them)\n") ||
		!strings.HasPrefix(out, "note: resources[0]: paths not checked: no CRD under crds: defines appmodels.iidp.com; validate --cluster checks them against the cluster's CRD\n") ||
		strings.Count(out, "\n") != 2 {
		t.Fatalf("validate good = %q %d", out, code)
	}
	bad := filepath.Join(testenv.Root(), "schema", "testdata", "five-mistakes.bad.yaml")
	_, errOut, code := metasync(t, "validate", "--config", bad)
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code != 1 || len(lines) != 7 || !slices.Contains(lines, "resources[0].version: required (for example v1)") {
		t.Fatalf("validate bad = %d lines, exit %d:\n%s", len(lines), code, errOut)
	}
}

// TestValidateCluster catches, in one run, a path typo (against the CRD's
// schema), a resource the cluster does not serve, and list/watch that RBAC
// denies to the caller.
func TestValidateCluster(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	kubeconfig, _ := env.UserKubeconfig(t, "validator")
	rbac := `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metasync-validator}
rules:
- apiGroups: [iidp.com]
  resources: [appmodels]
  verbs: [get, list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: metasync-validator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metasync-validator}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: validator}
`
	rbacPath := filepath.Join(t.TempDir(), "rbac.yaml")
	_ = os.WriteFile(rbacPath, []byte(rbac), 0o600)
	if err := kubeapply.Files(context.Background(), env.Config, rbacPath); err != nil {
		t.Fatal(err)
	}
	config := `
resources:
  - name: appmodels
    group: iidp.com
    version: v1
    resource: appmodels
    namespace: meta-test
    indexes:
      - name: model-to-app
        key: spec.modelz
        value: metadata.name
  - name: endpointslices
    group: discovery.k8s.io
    version: v1
    resource: endpointslices
    indexes:
      - name: service-to-addresses
        key: 'metadata.labels.kubernetes\.io/service-name'
  - name: ghosts
    group: nothere.iidp.com
    version: v1
    resource: ghosts
    indexes:
      - name: ghost
        key: spec.x
`
	path := filepath.Join(t.TempDir(), "config.yaml")
	_ = os.WriteFile(path, []byte(config), 0o600)
	_, errOut, code := metasync(t, "validate", "--config", path, "--cluster", "--kubeconfig", kubeconfig)
	if code != 1 {
		t.Fatalf("exit %d:\n%s", code, errOut)
	}
	for _, want := range []string{
		`resources[0].indexes[0].key: spec.modelz: no field "modelz" at spec (fields: models, type, version) in CRD appmodels.iidp.com v1`,
		`resources[1]: RBAC denies list on endpointslices.discovery.k8s.io in all namespaces`,
		`resources[1]: RBAC denies watch on endpointslices.discovery.k8s.io in all namespaces`,
		`resources[2]: ghosts is not served by the cluster: no API nothere.iidp.com/v1`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("validate --cluster lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, "resources[0]: RBAC") {
		t.Errorf("appmodels is allowed, yet:\n%s", errOut)
	}

	// The same config without the mistakes passes as that user.
	good := filepath.Join(t.TempDir(), "good.yaml")
	_ = os.WriteFile(good, []byte(strings.Split(strings.ReplaceAll(config, "spec.modelz", "spec.models"), "  - name: endpointslices")[0]), 0o600)
	out, errOut, code := metasync(t, "validate", "--config", good, "--cluster", "--kubeconfig", kubeconfig)
	if code != 0 || !strings.Contains(out, "valid: 1 resource, 1 index, 0 chains (checked against the cluster)") {
		t.Fatalf("good config: exit %d\n%s%s", code, out, errOut)
	}
}

// TestValidateClusterWithCRDFiles: a resource whose CRD the config lists
// under crds: is not "not served" while the CRD is not installed (serve
// installs it first): validate --cluster notes it, checks its paths
// against the file, and checks that the caller may install CRDs.
func TestValidateClusterWithCRDFiles(t *testing.T) {
	testenv.Need(t, env)
	dir := t.TempDir()
	crd := strings.ReplaceAll(testenv.LooseCRD("files.iidp.com", "Gizmo", "gizmos"), "x-kubernetes-preserve-unknown-fields: true",
		"properties: {size: {type: string}, parts: {type: object, properties: {n: {type: integer}}}}")
	config := `
crds: [gizmo-crd.yaml]
resources:
  - name: gizmos
    group: files.iidp.com
    version: v1
    resource: gizmos
    indexes:
      - name: gizmo-size
        key: spec.size
`
	for name, body := range map[string]string{"gizmo-crd.yaml": crd, "config.yaml": config, "bad.yaml": strings.Replace(config, "key: spec.size", "key: spec.parts", 1)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, code := metasync(t, "validate", filepath.Join(dir, "config.yaml"), "--cluster", "--kubeconfig", env.WriteKubeconfig(t, ""))
	if code != 0 || !strings.Contains(out, "note: resources[0]: gizmos is not served by the cluster yet: serve installs CRD gizmos.files.iidp.com from the crds: list first") {
		t.Errorf("validate --cluster of a config that installs its CRD: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code = metasync(t, "validate", filepath.Join(dir, "bad.yaml"), "--cluster", "--kubeconfig", env.WriteKubeconfig(t, ""))
	if code != 1 || !strings.Contains(errOut, "resources[0].indexes[0].key: spec.parts: is an object") {
		t.Errorf("validate --cluster of a key that is an object: exit %d\n%s", code, errOut)
	}
	// A caller who may not install CRDs is told so.
	kubeconfig, _ := env.UserKubeconfig(t, "no-crds")
	_, errOut, code = metasync(t, "validate", filepath.Join(dir, "config.yaml"), "--cluster", "--kubeconfig", kubeconfig)
	if code != 1 || !strings.Contains(errOut, "crds: RBAC denies patch on customresourcedefinitions.apiextensions.k8s.io") {
		t.Errorf("validate --cluster by a user without CRD rights: exit %d\n%s", code, errOut)
	}
}
