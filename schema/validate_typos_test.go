package schema

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
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

func TestClosest(t *testing.T) {
	known := []string{"name", "group", "version", "resource", "namespace", "labelSelector", "fieldSelector", "resync", "fields", "indexes", "allowSecrets"}
	cases := map[string]string{
		"versoin":       "version", // transposition: one edit
		"verison":       "version", // likewise
		"labelSelecter": "labelSelector",
		"labelselctor":  "labelSelector", // case is ignored
		"nmae":          "name",
		"namespce":      "namespace",
		"index":         "indexes",
		"resyncc":       "resync",
		"allowSecret":   "allowSecrets",
		"grp":           "group", // two edits in a short word
		"labels":        "",      // six letters from labelSelector: no guess
		"nonsense":      "",
		"x":             "",
		"":              "",
	}
	for word, want := range cases {
		if got := closest(word, known); got != want {
			t.Errorf("closest(%q) = %q, want %q", word, got, want)
		}
	}
	if got := closest("kee", []string{"name", "key", "value", "maxEntriesPerObject"}); got != "key" {
		t.Errorf("closest(kee) = %q", got)
	}
	if got := closest("valeu", []string{"name", "key", "value", "maxEntriesPerObject"}); got != "value" {
		t.Errorf("closest(valeu) = %q", got)
	}
}

// validGJSONPaths are paths that must keep passing: every path of the
// repository's configs and tests, and gjson's documented examples.
var validGJSONPaths = []string{
	// The repository's configs, examples and tests.
	"spec.models",
	"metadata.name",
	"spec.type.name",
	"spec.routes.#.hosts",
	"spec.routes.#.backend",
	"spec.priority",
	"spec.models.first",
	"spec.models.#",
	"spec.models.#(==x)",
	`metadata.labels.kubernetes\.io/service-name`,
	`metadata.labels.tier\.net\.iidp\.com/name`,
	"endpoints.#(conditions.ready==true)#.addresses|@flatten",
	"endpoints.#(conditions.serving==true)#.addresses|@flatten",
	"{metadata.name,spec.type}",
	"{a,b}",
	"***a*a*a",
	// gjson's SYNTAX.md and README.
	"name.last",
	"age",
	"children",
	"children.#",
	"children.1",
	"child*.2",
	"c?ildren.0",
	`fav\.movie`,
	"friends.#.first",
	"friends.1.last",
	"friends.#",
	"friends.#.age",
	`friends.#(last=="Murphy").first`,
	`friends.#(last=="Murphy")#.first`,
	"friends.#(age>45)#.last",
	`friends.#(first%"D*").last`,
	`friends.#(first!%"D*").last`,
	`children.#(!%"*a*")`,
	`children.#(%"*a*")#`,
	`friends.#(nets.#(=="fb"))#.first`,
	`friends.#[last=="Murphy"].first`, // the old query brackets
	"vals.#(b==~true)#.a",
	"vals.#(b==~false)#.a",
	"vals.#(b==~null)#.a",
	"vals.#(b==~*)#.a",
	"vals.#(b!=~*)#.a",
	"friends.#(age)",
	"friends.#(age<=45)#.last",
	`friends.#(last=="Mur\"phy").first`,
	`friends.#(last=="a)b").first`,
	"friends.0.first",
	"friends|0.first",
	"friends.0|first",
	"friends|0|first",
	"friends|#",
	`friends.#(last="Murphy")#|first`,
	`friends.#(last="Murphy")#|0`,
	"children.@reverse",
	"children.@reverse.0",
	"children|@reverse|0",
	"@reverse",
	"@this",
	"@valid",
	"@pretty",
	`@pretty:{"sortKeys":true}`,
	`@pretty:{"sortKeys":true}|name`,
	"@ugly",
	"friends.@flatten",
	`@join:{"preserve":true}`,
	"@keys",
	"@values",
	"@tostr",
	"spec.json|@fromstr|a",
	"@group",
	"@dig:name",
	`{name.first,age,"the_murphys":friends.#(last="Murphy")#.first}`,
	`{name.first,age,"company":!"Happysoft","employed":!true}`,
	"[name.first,age]",
	`{name.first,friends.#(last=="Murphy")#.first}|@reverse`,
	"{a,b}.a",
	"a.{b,c}",
	"a|[b,c]",
	"{a:b,c:d}",
	"[0]",
	"!true",
	"!false",
	"!null",
	"!NaN",
	"!42",
	"!-1.5e3",
	`!"text"`,
	`!{"a":1}`,
	`!{"a":1}.a`,
	"..0",
	"..#",
	`..#(name="May").age`,
	"a#b",
	"#",
	"a.#.b",
	`spec.\@thisone`, // escaped: a key, not a modifier
	`spec.a\[0\]`,
}

// badGJSONPaths are paths gjson cannot evaluate as meant, with what the
// error must say.
var badGJSONPaths = map[string]string{
	"spec.models.#(foo==":         `query "#(" is not closed`,
	"spec.models.#(":              `query "#(" is not closed`,
	"spec.models.#[":              `query "#[" is not closed`,
	"#(a==1":                      `query "#(" is not closed`,
	`friends.#(nets.#(=="fb")#.x`: `query "#(" is not closed`,
	`friends.#(last=="Murphy).x`:  `string "Murphy).x is not closed`,
	"spec.models.#(a==1]":         `"]" closes "("`,
	"spec.models.#()":             `empty query "#()"`,
	"spec.models.#(a==)":          `no value after "=="`,
	"spec.models.#(a!b)":          `unknown operator at "!b"`,
	"spec.models.#(a.)":           `path "a.": ends with "."`,
	"spec.models.#(a==1)x":        `unexpected "x" after "#(a==1)"`,
	"spec.models|":                `ends with "|"`,
	"spec.models.":                `ends with "."`,
	"|spec.models":                `starts with "|"`,
	".spec.models":                `starts with "."`,
	"spec..models":                `empty key at ".."`,
	"spec|.models":                `empty key at "|."`,
	"@nonexistentmodifier":        `unknown modifier "@nonexistentmodifier" (known: @dig, @flatten,`,
	"spec|@nonexistentmodifier":   `unknown modifier "@nonexistentmodifier"`,
	"spec.@reverse|@flaten":       `unknown modifier "@flaten" (did you mean @flatten?)`,
	"@reverse.x|@":                `"@" without a modifier name`,
	`@pretty:{"sortKeys":true`:    `argument of @pretty: "{" is not closed`,
	"spec[0]":                     `"[0]" is not gjson syntax; write spec.0`,
	"spec.containers[12].image":   `"[12]" is not gjson syntax; write containers.12`,
	"spec.containers[*].image":    `"[*]" is not gjson syntax; write containers.#`,
	"spec.containers[a].image":    `unexpected "[" in key "containers[a]"`,
	"spec.a)":                     `unexpected ")" in key "a)"`,
	"spec.a}b":                    `unexpected "}" in key "a}b"`,
	"spec)":                       `unexpected ")"`,
	")":                           `unbalanced ")"`,
	"spec.]":                      `unbalanced "]"`,
	"{name.first,age":             `multipath "{" is not closed`,
	"[name.first,age":             `multipath "[" is not closed`,
	"spec.{a,b":                   `multipath "{" is not closed`,
	"{a,b]":                       `"]" closes "{"`,
	"{a,b}}":                      `unexpected "}" after "{a,b}"`,
	"{a,b}x":                      `unexpected "x" after "{a,b}"`,
	"{}":                          `multipath "{}" has an empty path`,
	"{a,,b}":                      `has an empty path`,
	"{a,b.}":                      `path "b.": ends with "."`,
	"{a,@nope}":                   `unknown modifier "@nope"`,
	`spec\`:                       `ends with an escape "\"`,
	"!":                           `"!" without a literal`,
	"!yes":                        `unknown literal "!yes"`,
	"!12x":                        `literal "!12x" is not a number`,
	`!"abc`:                       `string "abc is not closed`,
	"..":                          `nothing after the JSON lines prefix ".."`,
	"...a":                        `starts with "."`,
}

func TestGJSONPathSyntax(t *testing.T) {
	for _, p := range validGJSONPaths {
		if err := checkGJSONPath(p); err != nil {
			t.Errorf("valid path %q refused: %v", p, err)
		}
		if _, err := CompileRule(p); err != nil {
			t.Errorf("CompileRule(%q): %v", p, err)
		}
		if _, err := CompileRule("x/${" + p + "}"); err != nil {
			t.Errorf("CompileRule(x/${%s}): %v", p, err)
		}
	}
	for p, want := range badGJSONPaths {
		err := checkGJSONPath(p)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("checkGJSONPath(%q) = %v, want %q", p, err, want)
		}
		if _, err := CompileRule(p); err == nil || !strings.HasPrefix(err.Error(), strconv.Quote(p)+": ") {
			t.Errorf("CompileRule(%q) = %v, want the path and the problem", p, err)
		}
	}
}

func TestBadGJSONPathsFile(t *testing.T) {
	wantProblems(t, "testdata/gjson-paths.bad.yaml", []string{
		`resources[0].fields.first: "spec[0]": "[0]" is not gjson syntax; write spec.0`,
		`resources[0].fields.owner: template "${metadata.namespace}/${spec.owner|}": "spec.owner|": ends with "|"`,
		`resources[0].indexes[0].key: "spec.models.#(foo==": query "#(" is not closed`,
		`resources[0].indexes[0].value: "spec.models.#(": query "#(" is not closed`,
		`resources[0].indexes[1].key: "spec.models|": ends with "|"`,
		`resources[0].indexes[1].value: "@nonexistentmodifier": unknown modifier "@nonexistentmodifier" (known: @dig, @flatten, @fromstr, @group, @join, @keys, @pretty, @reverse, @this, @tostr, @ugly, @valid, @values)`,
		`resources[0].indexes[2].key: "spec.models|@flaten": unknown modifier "@flaten" (did you mean @flatten?)`,
		`resources[0].indexes[2].value: "{metadata.name,spec.type": multipath "{" is not closed`,
	})
}

// FuzzGJSONPath: the checker never panics, and gjson evaluates whatever
// it accepts without panicking.
func FuzzGJSONPath(f *testing.F) {
	for _, p := range validGJSONPaths {
		f.Add(p)
	}
	for p := range badGJSONPaths {
		f.Add(p)
	}
	doc := `{"spec":{"models":["a","b"],"a":{"b":[1,{"c":2}]}},"friends":[{"first":"D","nets":["fb"]}]}`
	f.Fuzz(func(t *testing.T, path string) {
		if checkGJSONPath(path) == nil {
			_ = gjson.Get(doc, path)
		}
	})
}
