package main_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/iidp/metasync/internal/testenv"
)

// TestValidateReportsEveryProblem: `metasync validate` prints every problem
// of a file, one per line on stderr, and exits 1: unknown keys at every
// depth with a suggestion, and gjson paths that gjson cannot evaluate.
func TestValidateReportsEveryProblem(t *testing.T) {
	cases := map[string][]string{
		"typos.bad.yaml": {
			"chainz: unknown key (did you mean chains?)",
			"servr: unknown key (did you mean server?)",
			"resources[0].labelSelecter: unknown key (did you mean labelSelector?)",
			"resources[0].versoin: unknown key (did you mean version?)",
			"resources[0].indexes[0].kee: unknown key (did you mean key?)",
			"resources[0].indexes[0].valeu: unknown key (did you mean value?)",
			"resources[0].indexes[1].maxEntriesPerObjet: unknown key (did you mean maxEntriesPerObject?)",
			"resources[1].nonsense: unknown key",
			"resources[0].version: required (for example v1)",
			"resources[0].indexes[0].key: empty gjson path",
		},
		"gjson-paths.bad.yaml": {
			`resources[0].fields.first: "spec[0]": "[0]" is not gjson syntax; write spec.0`,
			`resources[0].fields.owner: template "${metadata.namespace}/${spec.owner|}": "spec.owner|": ends with "|"`,
			`resources[0].indexes[0].key: "spec.models.#(foo==": query "#(" is not closed`,
			`resources[0].indexes[0].value: "spec.models.#(": query "#(" is not closed`,
			`resources[0].indexes[1].key: "spec.models|": ends with "|"`,
			`resources[0].indexes[1].value: "@nonexistentmodifier": unknown modifier "@nonexistentmodifier" (known: @dig, @flatten, @fromstr, @group, @join, @keys, @pretty, @reverse, @this, @tostr, @ugly, @valid, @values)`,
			`resources[0].indexes[2].key: "spec.models|@flaten": unknown modifier "@flaten" (did you mean @flatten?)`,
			`resources[0].indexes[2].value: "{metadata.name,spec.type": multipath "{" is not closed`,
		},
	}
	for file, want := range cases {
		t.Run(file, func(t *testing.T) {
			path := filepath.Join(testenv.Root(), "schema", "testdata", file)
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
