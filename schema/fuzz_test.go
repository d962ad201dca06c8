package schema

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad: any file content either loads into a config that compiles, or
// fails with problems; never a panic.
func FuzzLoad(f *testing.F) {
	for _, name := range []string{"good.yaml", "five-mistakes.bad.yaml", "shapes.bad.yaml", "resync-number.bad.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("resources: {}"))
	f.Add([]byte("resources:\n- name: a\n  fields: {a.b: x}\n"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path, LoadOptions{Environ: []string{"METASYNC_LISTEN=127.0.0.1:1"}})
		if err != nil {
			if len(Problems(err)) == 0 {
				t.Fatalf("an error without problems: %v", err)
			}
			return
		}
		if _, err := Compile(c); err != nil {
			t.Fatalf("Load accepted what Compile refuses: %v", err)
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
