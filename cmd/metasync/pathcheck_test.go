package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// pathCheckConfig is a config of AppModels in namespace ns whose index
// key is typePath; the AppModel CRD is not under crds:.
func pathCheckConfig(addr, ns, typePath string) string {
	return fmt.Sprintf(`
server:
  listen: %s
resources:
  - name: appmodels
    group: iidp.com
    version: v1
    resource: appmodels
    namespace: %s
    indexes:
      - name: type-to-app
        key: %s
`, addr, ns, typePath)
}

// TestReloadRefusesPathsTheCRDLacks: with the CRD installed in the
// cluster but not listed under crds:, a reload whose path goes through a
// field the CRD's schema lacks (spec.type -> spec.typez) is refused with
// the field, as validate --cluster refuses it, and the index keeps
// answering from the last good config; serve refuses to start on it.
func TestReloadRefusesPathsTheCRDLacks(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "pathcheck"
	env.Namespace(t, ns)
	objects := filepath.Join(t.TempDir(), "objects.yaml")
	_ = os.WriteFile(objects, []byte(`
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: base, namespace: `+ns+`, labels: {iidp: iidp}}
spec: {type: model, version: "1.7", models: [model1]}
`), 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, objects); err != nil {
		t.Fatal(err)
	}
	kubeconfig := env.WriteKubeconfig(t, "")
	addr := testenv.FreeAddr(t)
	cm := newConfigMapDir(t, pathCheckConfig(addr, ns, "spec.type"))
	d := start(t, nil, "--config", cm.path(), "--kubeconfig", kubeconfig)
	waitHTTP(t, d, addr)
	lookup := func() string {
		a := call(t, "GET", base(addr)+"/v1/indexes/type-to-app/keys/model")
		return fmt.Sprint(a.code, a.body["values"])
	}
	testenv.Eventually(t, "model indexed", func() string {
		if got := lookup(); got != "200 ["+ns+"/base]" {
			return got
		}
		return ""
	})

	cm.swap(pathCheckConfig(addr, ns, "spec.typez"))
	testenv.Eventually(t, "the refused reload", func() string {
		if got := metric(t, base(addr), "metasync_config_last_reload_successful"); got != "0" {
			return "last_reload_successful " + got
		}
		return ""
	})
	want := `resources[0].indexes[0].key: spec.typez: no field \"typez\" at spec (fields: models, type, version) in CRD appmodels.iidp.com v1`
	if logs := d.stderr.String(); !strings.Contains(logs, want) {
		t.Errorf("the refused reload's log lacks %s:\n%s", want, logs)
	}
	if got := metric(t, base(addr), `metasync_config_reloads_total{result="failure"}`); got != "1" {
		t.Errorf(`reloads_total{result="failure"} = %q`, got)
	}
	if got := lookup(); got != "200 ["+ns+"/base]" {
		t.Errorf("the refused reload changed the index: %s", got)
	}
	if a := call(t, "GET", base(addr)+"/readyz"); a.code != 200 {
		t.Errorf("/readyz = %d after a refused reload", a.code)
	}

	// serve refuses to start on the same config, naming the field.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	_ = os.WriteFile(bad, []byte(pathCheckConfig(testenv.FreeAddr(t), ns, "spec.typez")), 0o600)
	_, errOut, code := metasync(t, "serve", "--config", bad, "--kubeconfig", kubeconfig)
	if code != 1 || !strings.Contains(errOut, strings.ReplaceAll(want, `\"`, `"`)) || strings.Contains(errOut, `"msg":"serving"`) {
		t.Fatalf("serve with a path the CRD lacks: exit %d\n%s", code, errOut)
	}
}

// TestValidateClusterEveryProblemInOneRun: an unknown key (with its "did
// you mean") and a path that the installed CRD lacks come out of one run
// of validate --cluster.
func TestValidateClusterEveryProblemInOneRun(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	config := strings.Replace(pathCheckConfig("127.0.0.1:0", "meta-test", "spec.typez"), "key: spec.typez", "key: spec.typez\n        uniq: true", 1)
	path := filepath.Join(t.TempDir(), "config.yaml")
	_ = os.WriteFile(path, []byte(config), 0o600)
	_, errOut, code := metasync(t, "validate", "--cluster", "--kubeconfig", env.WriteKubeconfig(t, ""), path)
	if code != 1 {
		t.Fatalf("exit %d:\n%s", code, errOut)
	}
	for _, want := range []string{
		"resources[0].indexes[0].uniq: unknown key (did you mean unique?)",
		`resources[0].indexes[0].key: spec.typez: no field "typez" at spec (fields: models, type, version) in CRD appmodels.iidp.com v1`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("validate --cluster lacks %q:\n%s", want, errOut)
		}
	}
}
