package main_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/test/testenv"
)

// TestValidateReportsEveryProblem: `metasync validate` prints every problem
// that schema finds in a file (unknown keys at every depth with a
// suggestion, gjson paths that gjson cannot evaluate; schema's own tests
// pin the wording), one per line on stderr, and exits 1.
func TestValidateReportsEveryProblem(t *testing.T) {
	for _, file := range []string{"typos.bad.yaml", "gjson-paths.bad.yaml"} {
		t.Run(file, func(t *testing.T) {
			path := filepath.Join(testenv.Root(), "schema", "testdata", file)
			_, err := schema.Load(path, schema.LoadOptions{})
			var want []string
			for _, p := range schema.Problems(err) {
				want = append(want, p.Error())
			}
			if len(want) < 8 {
				t.Fatalf("schema finds %d problems in %s: %v", len(want), file, err)
			}
			out, errOut, code := metasync(t, "validate", "--config", path)
			lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
			if code != 1 || out != "" {
				t.Errorf("exit %d, stdout %q", code, out)
			}
			if len(lines) != len(want) {
				t.Errorf("%d lines, want %d, one per problem", len(lines), len(want))
			}
			for _, w := range want {
				if !slices.Contains(lines, w) {
					t.Errorf("missing line %q", w)
				}
			}
			if t.Failed() {
				t.Logf("stderr:\n%s", errOut)
			}
		})
	}
}

// TestValidateAcceptsDocumentedPaths: the repository's configs, whose
// paths use escapes, queries, pipes, modifiers and templates, stay valid.
// A cluster's kubeconfig is a file mounted in the pod: the test puts one
// with the contexts the config names in its place, in a copy.
func TestValidateAcceptsDocumentedPaths(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(testenv.Root(), "examples", "*", "config*.yaml"))
	files = append(files,
		filepath.Join(testenv.Root(), "config.example.yaml"),
		filepath.Join(testenv.Root(), "deploy", "base", "app", "config.yaml"),
	)
	for _, f := range files {
		f = withKubeconfigs(t, f)
		out, errOut, code := metasync(t, "validate", "--config", f)
		if code != 0 || !strings.Contains(out, ": valid: ") {
			t.Errorf("%s: exit %d\n%s%s", f, code, out, errOut)
		}
	}
}

// withKubeconfigs returns path, or when its config names kubeconfig files,
// a copy whose kubeconfigs are temporary files that hold every context the
// config names.
func withKubeconfigs(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	files := regexp.MustCompile(`(?m)^\s*kubeconfig:\s*(\S+)`).FindAllSubmatch(data, -1)
	if len(files) == 0 {
		return path
	}
	contexts := "contexts:\n"
	for _, m := range regexp.MustCompile(`(?m)^\s*context:\s*(\S+)`).FindAllSubmatch(data, -1) {
		contexts += fmt.Sprintf("- name: %s\n  context: {cluster: c, user: u}\n", m[1])
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: u\n  user: {token: t}\n"+contexts+"- name: default\n  context: {cluster: c, user: u}\ncurrent-context: default\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, m := range files {
		data = bytes.ReplaceAll(data, m[1], []byte(kubeconfig))
	}
	copied := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(copied, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return copied
}
