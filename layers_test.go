package metasync_test

import (
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/iidp/metasync/"

// layers places every folder of Go code: data flows up, from the pure
// parts through the config and the engine to its faces, and a package
// imports only from its own layer or below. A new folder goes in the
// layer of what it is; a folder not listed fails the test.
var layers = []struct {
	name    string
	folders []string
}{
	{"parts below the config: no config, no engine", []string{"indexer", "internal/plan", "internal/warmfile", "internal/wire", "internal/tlsfiles", "internal/configfile", "internal/kubejson", "internal/kubeapply", "internal/admission", "schema/internal/problems"}},
	{"config: loading, validation, compilation", []string{"schema", "schema/cluster"}},
	{"engine", []string{"sync", "sync/internal/follow"}},
	{"faces of the engine", []string{"metasynctest", "grpcresolver", "internal/streamclient", "test/testenv", "test/routingtest", "test/authtest", "cmd/metasync/internal/server", "cmd/metasync/internal/auth", "cmd/metasync/internal/xds", "cmd/metasync/internal/consul"}},
	{"programs, examples and tests on a control plane", []string{"cmd/metasync", "examples/appmodel", "examples/appmodel/grpcclient", "examples/library", "hack/authload", "hack/bareinformer", "hack/bench", "hack/devcluster", "hack/streamload", "hack/xdsload", "hack/xdspeer", "test/chaos", "test/integration", "deploy", "."}},
}

// libraries are the packages a user imports: their tests start no control
// plane, so that a user's go mod tidy, which loads the tests of the
// packages it imports, does not fetch envtest, etcd and prometheus.
var libraries = []string{"indexer", "schema", "sync", "grpcresolver", "metasynctest"}

// TestLibraryTestsNeedNoControlPlane: the tests of the library packages
// import neither test/testenv nor envtest (those tests live in test/).
func TestLibraryTestsNeedNoControlPlane(t *testing.T) {
	for _, dir := range libraries {
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range append(pkg.TestImports, pkg.XTestImports...) {
			if imp == module+"test/testenv" || strings.HasPrefix(imp, "sigs.k8s.io/controller-runtime") {
				t.Errorf("a test of %s imports %s: move it to test/integration", dir, imp)
			}
		}
	}
}

// TestLayers: no import runs from a lower layer to a higher one.
func TestLayers(t *testing.T) {
	layerOf := map[string]int{}
	for i, l := range layers {
		for _, f := range l.folders {
			layerOf[f] = i
		}
	}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		folder := filepath.ToSlash(path)
		mine, ok := layerOf[folder]
		if pkg, err := build.ImportDir(path, 0); err == nil && !ok {
			// Test-only folders too: every folder of Go code has a layer.
			t.Errorf("%s (package %s) is in no layer: add it to layers in layers_test.go", folder, pkg.Name)
			return nil
		}
		_, files, err := parsePackage(token.NewFileSet(), path, parser.ImportsOnly)
		if err != nil || files == nil {
			return err
		}
		for name, file := range files {
			for _, imp := range file.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				dep, ok := strings.CutPrefix(p, module)
				if !ok {
					continue
				}
				if theirs, ok := layerOf[dep]; ok && theirs > mine {
					t.Errorf("%s (%s) imports %s (%s), a higher layer", name, layers[mine].name, dep, layers[theirs].name)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
