package plan

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func eval(t *testing.T, rule, doc string) ([]string, error) {
	t.Helper()
	r, err := CompileRule(rule)
	if err != nil {
		t.Fatalf("compile %q: %v", rule, err)
	}
	var out []string
	err = r.Eval(doc, func(s string) { out = append(out, s) })
	return out, err
}

func TestRuleEvaluation(t *testing.T) {
	doc := `{
	  "metadata": {"name": "base", "namespace": "ns", "labels": {"kubernetes.io/service-name": "svc", "n": "1"}},
	  "spec": {"models": ["m1", "m2"], "type": "model", "version": "1.7", "port": 8080, "on": true,
	           "empty": [], "nil": null, "obj": {"a": 1}, "mixed": ["a", {"b": 1}],
	           "routes": [{"hosts": ["h1", "h2"]}, {"hosts": ["h3"]}, {"hosts": []}],
	           "nested": [["x", "y"], ["z"]], "nulls": ["a", null], "uni": "モデル"},
	  "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
	                {"addresses": ["10.0.0.2"], "conditions": {"ready": false}}]
	}`
	cases := []struct {
		rule string
		want []string
		err  string
	}{
		{rule: "spec.models", want: []string{"m1", "m2"}},
		{rule: "spec.type", want: []string{"model"}},
		{rule: "spec.port", want: []string{"8080"}},
		{rule: "spec.on", want: []string{"true"}},
		{rule: "spec.missing"},
		{rule: "spec.nil"},
		{rule: "spec.empty"},
		{rule: "spec.uni", want: []string{"モデル"}},
		{rule: "spec.nulls", want: []string{"a"}},
		{rule: "spec.nested", want: []string{"x", "y", "z"}},
		{rule: "spec.routes.#.hosts", want: []string{"h1", "h2", "h3"}},
		{rule: `metadata.labels.kubernetes\.io/service-name`, want: []string{"svc"}},
		{rule: `endpoints.#(conditions.ready==true)#.addresses|@flatten`, want: []string{"10.0.0.1"}},
		{rule: "spec.obj", err: "spec.obj is an object"},
		{rule: "spec.mixed", err: "spec.mixed is an array holding an object"},
		{rule: `${metadata.namespace}/${metadata.labels.kubernetes\.io/service-name}`, want: []string{"ns/svc"}},
		{rule: `${metadata.namespace}/${spec.models}`, want: []string{"ns/m1", "ns/m2"}},
		{rule: `${metadata.namespace}/${spec.missing}`},
		{rule: `${spec.models}-${spec.models}`, want: []string{"m1-m1", "m1-m2", "m2-m1", "m2-m2"}},
		{rule: `v${spec.version}`, want: []string{"v1.7"}},
		{rule: `${spec.obj}`, err: "spec.obj is an object"},
		{rule: `${{metadata.name,spec.type}}`, err: "is an object"},
	}
	for _, c := range cases {
		got, err := eval(t, c.rule, doc)
		if c.err != "" {
			var se *ShapeError
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.As(err, &se) {
				t.Errorf("%s: err = %v, want %q", c.rule, err, c.err)
			}
			if len(got) != 0 {
				t.Errorf("%s: emitted %v with an error", c.rule, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.rule, err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s = %q, want %q", c.rule, got, c.want)
		}
	}
}

func TestRuleOnOddDocuments(t *testing.T) {
	for _, doc := range []string{"", "null", "[]", "42", `"s"`, "{", `{"spec":`, `{"spec":{"models":[1,2.5,-3e2]}}`} {
		_, _ = eval(t, "spec.models", doc)
		_, _ = eval(t, "${spec.models}/${metadata.name}", doc)
	}
	got, _ := eval(t, "spec.models", `{"spec":{"models":[1,2.5,-3e2]}}`)
	if !slices.Equal(got, []string{"1", "2.5", "-3e2"}) {
		t.Errorf("numbers = %v", got)
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
	"@nonexistentmodifier":        `unknown modifier "@nonexistentmodifier" (known: @dig, @endpoints, @flatten,`,
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

// FuzzRuleEval: any rule on any JSON document emits values or a
// ShapeError; never a panic, never another error.
func FuzzRuleEval(f *testing.F) {
	f.Add("spec.models", `{"spec":{"models":["a","b"]}}`)
	f.Add(`${metadata.namespace}/${spec.models}`, `{"metadata":{"namespace":"n"},"spec":{"models":[1,[2,[3]],null]}}`)
	f.Add(`endpoints.#(conditions.ready==true)#.addresses|@flatten`, `{"endpoints":[{"addresses":["1"],"conditions":{"ready":true}}]}`)
	f.Add(`metadata.labels.kubernetes\.io/service-name`, `{"metadata":{"labels":{"kubernetes.io/service-name":"s"}}}`)
	f.Add(`${{a,b}}`, `{"a":{"x":1},"b":"\u0000"}`)
	f.Add("a.b", `{"a":`)
	f.Fuzz(func(t *testing.T, rule, doc string) {
		r, err := CompileRule(rule)
		if err != nil {
			return
		}
		n := 0
		err = r.Eval(doc, func(string) { n++ })
		var se *ShapeError
		if err != nil && !errors.As(err, &se) {
			t.Fatalf("Eval(%q) on %q: %v is not a ShapeError", rule, doc, err)
		}
		if err != nil && n > 0 {
			t.Fatalf("Eval emitted %d values and failed", n)
		}
		// With a bound: the same values up to it, a LimitError past it.
		for _, max := range []int{1, 2, 3} {
			m := 0
			lerr := r.EvalMax(doc, Limit{Values: max}, func(string) { m++ })
			var le *LimitError
			switch {
			case err != nil:
				if lerr == nil || (!errors.As(lerr, &se) && !errors.As(lerr, &le)) {
					t.Fatalf("EvalMax(%d) of a rule whose Eval fails: %v", max, lerr)
				}
			case n > max:
				if !errors.As(lerr, &le) || le.Max != max {
					t.Fatalf("EvalMax(%d) of %d values: %v, want a LimitError", max, n, lerr)
				}
			case lerr != nil || m != n:
				t.Fatalf("EvalMax(%d) of %d values: %d values, %v", max, n, m, lerr)
			}
		}
	})
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
		if got := Closest(word, known); got != want {
			t.Errorf("closest(%q) = %q, want %q", word, got, want)
		}
	}
	if got := Closest("kee", []string{"name", "key", "value", "maxEntriesPerObject"}); got != "key" {
		t.Errorf("closest(kee) = %q", got)
	}
	if got := Closest("valeu", []string{"name", "key", "value", "maxEntriesPerObject"}); got != "value" {
		t.Errorf("closest(valeu) = %q", got)
	}
}
