package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/schema"
)

const crdPathsResources = `
resources:
  - name: loose
    group: test.iidp.com
    version: v1
    resource: loosemodels
    indexes:
      - name: m
        key: spec.models
`

// writeCRDPathsConfig writes, under root, conf/config.yaml listing crds,
// and conf/crd.yaml and conf/more/other.yaml (copies of a real CRD file).
func writeCRDPathsConfig(t *testing.T, root, crds string) {
	t.Helper()
	crd, err := os.ReadFile("../testdata/loose-crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "conf", "more"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"config.yaml":     []byte("crds: " + crds + "\n" + crdPathsResources),
		"crd.yaml":        crd,
		"more/other.yaml": crd,
	} {
		if err := os.WriteFile(filepath.Join(root, "conf", name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCRDPathsRelativeToConfig: a relative entry of crds: names a file
// next to the config file, whatever the working directory; an absolute
// entry is kept; the config file may be named by a relative or an
// absolute path; paths given as flags are kept as they are.
func TestCRDPathsRelativeToConfig(t *testing.T) {
	root := t.TempDir()
	abs := filepath.Join(root, "elsewhere", "abs.yaml")
	writeCRDPathsConfig(t, root, "[crd.yaml, more/other.yaml, ./crd.yaml, "+abs+"]")
	elsewhere := filepath.Join(root, "elsewhere")
	if err := os.MkdirAll(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(elsewhere)

	conf := filepath.Join(root, "conf")
	for _, path := range []string{
		filepath.Join(conf, "config.yaml"),         // absolute
		filepath.Join("..", "conf", "config.yaml"), // relative to the working directory
	} {
		c, err := schema.Load(path, schema.LoadOptions{})
		if err != nil {
			t.Fatalf("load %s: %v", path, err)
		}
		dir := filepath.Dir(path)
		want := []string{
			filepath.Join(dir, "crd.yaml"),
			filepath.Join(dir, "more", "other.yaml"),
			filepath.Join(dir, "crd.yaml"),
			abs,
		}
		if !slices.Equal(c.CRDs, want) {
			t.Errorf("load %s: crds = %q, want %q", path, c.CRDs, want)
		}
		plan, err := schema.Compile(c)
		if err != nil {
			t.Fatal(err)
		}
		// The files are found from here, which is not the config's folder.
		if crds, err := ReadCRDs(plan.CRDs()[:3]); err != nil || len(crds) != 3 {
			t.Errorf("load %s: read %d CRDs: %v", path, len(crds), err)
		}
	}

	// Flags name files from the working directory, as any command-line
	// path does: they are not rewritten.
	c, err := schema.Load(filepath.Join(conf, "config.yaml"), schema.LoadOptions{Flags: map[string]any{"crds": []string{"flag.yaml"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.CRDs, []string{"flag.yaml"}) {
		t.Errorf("crds from flags = %q, want [flag.yaml]", c.CRDs)
	}
}

// TestCRDPathsBlankStillReported: a blank entry is not turned into the
// config's folder, so validation still reports it with its field path.
func TestCRDPathsBlankStillReported(t *testing.T) {
	root := t.TempDir()
	writeCRDPathsConfig(t, root, `[crd.yaml, " "]`)
	_, err := schema.Load(filepath.Join(root, "conf", "config.yaml"), schema.LoadOptions{})
	if err == nil || !strings.Contains(err.Error(), "crds[1]: empty file path") {
		t.Fatalf("err = %v, want crds[1]: empty file path", err)
	}
}

// TestOptionalOnlyWarning: an entry that only clusters with required:
// false read is warned of.
func TestOptionalOnlyWarning(t *testing.T) {
	p, err := schema.LoadPlan("../testdata/clusters.good.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := "resources[0].clusters: appmodels is watched only in clusters with required: false: its answers count as synced once one of them has listed, and /readyz does not wait for it"
	if got := Warnings(p, nil); !slices.Contains(got, want) {
		t.Fatalf("warnings %q, want %q among them", got, want)
	}
}

// TestShortDropAfterWarning: a dropAfter under serve's default
// --stale-after is warned of.
func TestShortDropAfterWarning(t *testing.T) {
	p, err := schema.Compile(&schema.Config{
		Clusters: []schema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "k", DropAfter: time.Nanosecond}},
		Resources: []schema.Resource{{Name: "cms", Version: "v1", Resource: "configmaps",
			Indexes: []schema.Index{{Name: "by-app", Key: "data.app"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := Warnings(p, nil)
	if len(got) != 1 || !strings.HasPrefix(got[0], "clusters[1].dropAfter: 1ns is shorter than --stale-after's default of 30s") {
		t.Fatalf("warnings %q", got)
	}
}
