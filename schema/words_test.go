package schema

import (
	"os"
	"strings"
	"testing"
)

// TestEntryUnderTheWrongList: a resource entry appended after chains: is
// one problem that says so, not a list of unknown keys and Go types.
func TestEntryUnderTheWrongList(t *testing.T) {
	wantProblems(t, "testdata/appended-resource.bad.yaml", []string{
		"chains[1]: this looks like a resource entry (it has group, resource, version), under chains:. " +
			"Is it under chains: by mistake? Resource entries go under resources: " +
			"(an entry added at the end of the file lands in the last list, often chains:)",
	})
}

// TestWrongKindsInTheConfigsWords: a value of the wrong kind is said as
// what the field wants and what the file gave, never as a Go type; a
// chain entry under resources: is said as such.
func TestWrongKindsInTheConfigsWords(t *testing.T) {
	wantProblems(t, "testdata/wrong-kinds.bad.yaml", []string{
		"server.listen: want a string, got a list",
		"resources[0].fields: want a mapping of names to strings (name: value lines), got a list",
		"resources[0].indexes[0].key: want a string, got a mapping (key: value lines)",
		`resources[0].indexes[0].maxEntriesPerObject: want a whole number, got "lots"`,
		`resources[0].indexes[0].unique: want true or false, got "maybe"`,
		"resources[1]: this looks like a chain entry (a name and a list of index names), under resources:. Is it under resources: by mistake? Chains go under chains:",
		"chains: want a list, got a mapping (key: value lines)",
	})
	_, err := Load("testdata/wrong-kinds.bad.yaml", LoadOptions{})
	for _, goType := range []string{"interface", "map[", "[]", "unconvertible", "'int'", "'bool'"} {
		if strings.Contains(err.Error(), goType) {
			t.Errorf("a problem names a Go type (%s):\n%v", goType, err)
		}
	}
}

// TestCheckAllGoesOnPastUnknownKeys: for a validator, a config whose only
// problems are unknown keys still gives its plan, so that the checks that
// need one (CRD schemas, the cluster) report in the same run; any other
// problem gives none.
func TestCheckAllGoesOnPastUnknownKeys(t *testing.T) {
	dir := t.TempDir()
	good := `resources:
  - name: a
    group: iidp.com
    version: v1
    resource: appmodels
    indexes:
      - name: model-to-app
        key: spec.models
        uniq: true
`
	path := dir + "/c.yaml"
	writeFile(t, path, good)
	p, err := LoadPlan(path, LoadOptions{CheckAll: true})
	if p == nil || err == nil || !strings.Contains(err.Error(), "uniq: unknown key (did you mean unique?)") {
		t.Fatalf("plan %v, err %v", p, err)
	}
	if p, _ := LoadPlan(path, LoadOptions{}); p != nil {
		t.Error("a plan without CheckAll")
	}
	writeFile(t, path, strings.Replace(good, "version: v1", "versoin: v1", 1))
	if p, err := LoadPlan(path, LoadOptions{CheckAll: true}); p != nil {
		t.Errorf("a plan whose typo left a required field empty: %v", err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
