package schema

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// wantProblems loads file and checks that its problems are exactly want,
// in any order, one per line.
func wantProblems(t *testing.T, file string, want []string) {
	t.Helper()
	_, err := Load(file, LoadOptions{})
	if err == nil {
		t.Fatalf("%s loaded", file)
	}
	var got []string
	for _, p := range Problems(err) {
		got = append(got, p.Error())
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s: missing problem %q", file, w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("%s: unexpected problem %q", file, g)
		}
	}
	if t.Failed() {
		t.Logf("all problems:\n%v", err)
	}
}

func TestTyposAtEveryDepth(t *testing.T) {
	wantProblems(t, "testdata/typos.bad.yaml", []string{
		"servr: unknown key (did you mean server?)",
		"chainz: unknown key (did you mean chains?)",
		"resources[0].versoin: unknown key (did you mean version?)",
		"resources[0].labelSelecter: unknown key (did you mean labelSelector?)",
		"resources[0].indexes[0].kee: unknown key (did you mean key?)",
		"resources[0].indexes[0].valeu: unknown key (did you mean value?)",
		"resources[0].indexes[1].maxEntriesPerObjet: unknown key (did you mean maxEntriesPerObject?)",
		"resources[1].nonsense: unknown key",
		// Consequences of the typos, reported too.
		"resources[0].version: required (for example v1)",
		"resources[0].indexes[0].key: empty gjson path",
	})
}

// TestOuterUnknownKeysFirst: a level's unknown keys come before the
// problems inside it, so the output reads from the top of the file down.
func TestOuterUnknownKeysFirst(t *testing.T) {
	_, err := Load("testdata/typos.bad.yaml", LoadOptions{})
	lines := strings.Split(err.Error(), "\n")[1:]
	at := func(prefix string) int {
		return slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
	}
	if !(at("servr:") < at("resources[0].versoin:") && at("resources[0].versoin:") < at("resources[0].indexes[0].kee:")) {
		t.Errorf("order:\n%s", strings.Join(lines, "\n"))
	}
}

// TestEveryDecodeProblem: several type errors at several depths are all
// reported, not only the first one.
func TestEveryDecodeProblem(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	body := `crds: nope
resources:
  - name: a
    version: [v1]
    resource: pods
    resync: 300
    indexes:
      - {name: a, key: spec.x, maxEntriesPerObject: lots}
  - name: b
    version: {v: 1}
    resource: pods
    labelSelectr: x
    indexes: [{name: b, key: spec.x}]
`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path, LoadOptions{})
	for _, w := range []string{
		"crds: want a list",
		"resources[0].version: want a string",
		"resources[0].resync: 300 has no unit",
		"resources[0].indexes[0].maxEntriesPerObject: ",
		"resources[1].version: want a string",
		"resources[1].labelSelectr: unknown key (did you mean labelSelector?)",
	} {
		if err == nil || !strings.Contains(err.Error(), "\n"+w) {
			t.Errorf("missing %q in:\n%v", w, err)
		}
	}
}

// TestKnownKeysFromTags: the keys that typos are matched against are the
// koanf tags of the config types, so a new field is known at once.
func TestKnownKeysFromTags(t *testing.T) {
	tags := func(v any) []string {
		var out []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			out = append(out, strings.Split(rt.Field(i).Tag.Get("koanf"), ",")[0])
		}
		return out
	}
	cases := map[string][]string{
		"":                         tags(Config{}),
		"server":                   tags(Server{}),
		"resources[2]":             tags(Resource{}),
		"resources[0].indexes[13]": tags(Index{}),
		"chains[1]":                tags(Chain{}),
		"Resources[0]":             tags(Resource{}), // the decoder ignores case
		"resources[0].fields":      nil,              // free keys
		"resources[0].name":        nil,
		"nope[0]":                  nil,
	}
	for at, want := range cases {
		if got := keysAt(at); !slices.Equal(got, want) {
			t.Errorf("keysAt(%q) = %q, want %q", at, got, want)
		}
	}
	if !slices.Contains(keysAt("resources[0].indexes[0]"), "maxEntriesPerObject") {
		t.Error("maxEntriesPerObject is not a known key of an index")
	}
}

func TestBadGJSONPathsFile(t *testing.T) {
	wantProblems(t, "testdata/gjson-paths.bad.yaml", []string{
		`resources[0].fields.first: "spec[0]": "[0]" is not gjson syntax; write spec.0`,
		`resources[0].fields.owner: template "${metadata.namespace}/${spec.owner|}": "spec.owner|": ends with "|"`,
		`resources[0].indexes[0].key: "spec.models.#(foo==": query "#(" is not closed`,
		`resources[0].indexes[0].value: "spec.models.#(": query "#(" is not closed`,
		`resources[0].indexes[1].key: "spec.models|": ends with "|"`,
		`resources[0].indexes[1].value: "@nonexistentmodifier": unknown modifier "@nonexistentmodifier" (known: @dig, @endpoints, @flatten, @fromstr, @group, @join, @keys, @pretty, @reverse, @this, @tostr, @ugly, @valid, @values)`,
		`resources[0].indexes[2].key: "spec.models|@flaten": unknown modifier "@flaten" (did you mean @flatten?)`,
		`resources[0].indexes[2].value: "{metadata.name,spec.type": multipath "{" is not closed`,
	})
}
