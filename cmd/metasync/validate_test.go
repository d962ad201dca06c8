package main_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/iidp/metasync/internal/testenv"
	"github.com/iidp/metasync/schema"
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
func TestValidateAcceptsDocumentedPaths(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(testenv.Root(), "examples", "*", "config*.yaml"))
	files = append(files,
		filepath.Join(testenv.Root(), "config.example.yaml"),
		filepath.Join(testenv.Root(), "deploy", "base", "app", "config.yaml"),
	)
	for _, f := range files {
		out, errOut, code := metasync(t, "validate", "--config", f)
		if code != 0 || !strings.Contains(out, ": valid: ") {
			t.Errorf("%s: exit %d\n%s%s", f, code, out, errOut)
		}
	}
}
