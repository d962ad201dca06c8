package plan

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
)

// Rule is a compiled key, value or field expression: one gjson path, or a
// template that mixes literal text with paths written as ${path}.
//
// Evaluation rules: a missing path (or null) yields nothing; a string,
// number or bool yields its text (a number as written in the JSON); an
// array yields its elements, nested arrays flattened; an object, or an
// array holding one, is a ShapeError. A template yields every combination
// of its paths' values, and nothing if any path yields nothing.
type Rule struct {
	src   string
	parts []rulePart
	// endpoints is set for a rule that is @endpoints alone, evaluated on
	// the slice without gjson.
	endpoints *endpointsOptions
}

type rulePart struct {
	literal string
	path    string // "" for a literal part
}

// String returns the rule as written.
func (r *Rule) String() string { return r.src }

// ShapeError reports a path whose value is of a shape that cannot be an
// index key or value.
type ShapeError struct {
	Path string
	Kind string // what it is instead: "an object", "an array holding an object", "not valid JSON"
}

func (e *ShapeError) Error() string {
	return fmt.Sprintf("%s is %s, want a string, number, bool or an array of them", e.Path, e.Kind)
}

// CompileRule parses a rule. A string without "${" is one gjson path.
func CompileRule(src string) (*Rule, error) {
	if strings.TrimSpace(src) == "" {
		return nil, errors.New("empty gjson path")
	}
	if !strings.Contains(src, "${") {
		r, err := checkRule(&Rule{src: src, parts: []rulePart{{path: src}}})
		if o, ok := directEndpoints(src); ok && err == nil {
			r.endpoints = &o
		}
		return r, err
	}
	r := &Rule{src: src}
	rest := src
	for rest != "" {
		i := strings.Index(rest, "${")
		if i < 0 {
			r.parts = append(r.parts, rulePart{literal: rest})
			break
		}
		if i > 0 {
			r.parts = append(r.parts, rulePart{literal: rest[:i]})
		}
		// Find the brace that closes "${", allowing braces inside the path
		// (gjson multipaths and queries use them).
		depth, end := 1, -1
		for j := i + 2; j < len(rest) && end < 0; j++ {
			switch rest[j] {
			case '\\':
				j++
			case '{':
				depth++
			case '}':
				depth--
				if depth == 0 {
					end = j
				}
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("template %q: \"${\" at offset %d is not closed", src, len(src)-len(rest)+i)
		}
		path := rest[i+2 : end]
		if strings.TrimSpace(path) == "" {
			return nil, fmt.Errorf("template %q: empty path in \"${}\"", src)
		}
		r.parts = append(r.parts, rulePart{path: path})
		rest = rest[end+1:]
	}
	return checkRule(r)
}

// Limit bounds what a rule may yield on one object: the number of values
// and their bytes in all. A zero field is no bound.
type Limit struct {
	Values int
	Bytes  int
}

// LimitError reports a rule that yields more on one object than its
// Limit allows.
type LimitError struct {
	Rule  string
	What  string // "values" or "bytes"
	Count int    // what the rule yields, or a lower bound
	Max   int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s yields %d %s on this object, over the limit of %d", e.Rule, e.Count, e.What, e.Max)
}

// over returns the LimitError of n values of size bytes, or nil.
func (l Limit) over(rule string, n, size int) error {
	switch {
	case l.Values > 0 && n > l.Values:
		return &LimitError{Rule: rule, What: "values", Count: n, Max: l.Values}
	case l.Bytes > 0 && size > l.Bytes:
		return &LimitError{Rule: rule, What: "bytes", Count: size, Max: l.Bytes}
	}
	return nil
}

// Eval evaluates the rule on one JSON document and calls emit with each
// value, in document order, possibly more than once with the same value.
// Emitted strings may share memory with json: clone what you keep. Eval
// emits nothing and returns a *ShapeError when a path has a bad shape.
func (r *Rule) Eval(json string, emit func(string)) error {
	return r.EvalMax(json, Limit{}, emit)
}

// EvalMax is Eval with a bound: when the rule yields more values, or more
// bytes, than lim allows, it returns a *LimitError, and the caller must
// drop what was emitted. A template's combinations are counted, and their
// sizes summed, before any is built, so the work and memory of a rule on
// one object are bounded by lim and the size of the object, not by the
// product of its arrays.
func (r *Rule) EvalMax(json string, lim Limit, emit func(string)) error {
	return r.EvalDoc(&Doc{JSON: json}, lim, emit)
}

// Doc is one JSON document that several rules are evaluated on, by
// EvalDoc: what a rule reads of it that others read too (the table of an
// EndpointSlice) is read once and kept here, for as long as the Doc.
type Doc struct {
	JSON  string
	slice *slice
}

func (d *Doc) endpointSlice() *slice {
	if d.slice == nil {
		d.slice = readSlice(d.JSON)
	}
	return d.slice
}

// EvalDoc is EvalMax on a Doc.
func (r *Rule) EvalDoc(d *Doc, lim Limit, emit func(string)) error {
	json := d.JSON
	if len(r.parts) == 1 && r.parts[0].path != "" {
		n, size := 0, 0
		var over error
		counted := func(s string) {
			n++
			size += len(s)
			if over == nil {
				if over = lim.over(r.src, n, size); over == nil {
					emit(s)
				}
			}
		}
		var err error
		if r.endpoints != nil {
			r.evalEndpoints(d.endpointSlice(), counted)
		} else {
			err = each(r.parts[0].path, gjson.Get(json, r.parts[0].path), counted)
		}
		if err == nil && over != nil {
			return lim.over(r.src, n, size) // with the whole count
		}
		return err
	}
	// Template: gather each path's values, then emit every combination.
	values := make([][]string, len(r.parts))
	for i, p := range r.parts {
		if p.path == "" {
			values[i] = []string{p.literal}
			continue
		}
		err := each(p.path, gjson.Get(json, p.path), func(s string) { values[i] = append(values[i], s) })
		if err != nil {
			return err
		}
		if len(values[i]) == 0 {
			return nil
		}
	}
	if lim.Values > 0 || lim.Bytes > 0 {
		// Every combination of the parts' values, and their bytes: each
		// value of part i appears in combinations/len(values[i]) of them.
		combinations := 1
		for _, vs := range values {
			combinations *= len(vs) // each factor is at most the object's size
			if err := lim.over(r.src, combinations, 0); err != nil {
				return err
			}
		}
		size := 0
		for _, vs := range values {
			sum := 0
			for _, v := range vs {
				sum += len(v)
			}
			size += sum * (combinations / len(vs))
			if err := lim.over(r.src, combinations, size); err != nil {
				return err
			}
		}
	}
	var walk func(i int, prefix string)
	walk = func(i int, prefix string) {
		if i == len(values) {
			emit(prefix)
			return
		}
		for _, v := range values[i] {
			walk(i+1, prefix+v)
		}
	}
	walk(0, "")
	return nil
}

// evalEndpoints emits what the rule's @endpoints yields on a slice, as
// gjson would through the modifier, but with no JSON in between: the
// values are written into one buffer, made a string once.
func (r *Rule) evalEndpoints(sl *slice, emit func(string)) {
	var buf []byte
	var ends []int
	r.endpoints.each(sl, func(v []byte) {
		buf = append(buf, v...)
		ends = append(ends, len(buf))
	})
	all, start := string(buf), 0
	for _, end := range ends {
		emit(all[start:end])
		start = end
	}
}

// each emits the text of a scalar, or of every scalar in an array.
func each(path string, res gjson.Result, emit func(string)) error {
	switch res.Type {
	case gjson.Null:
		return nil
	case gjson.String:
		emit(res.Str)
		return nil
	case gjson.Number:
		emit(res.Raw)
		return nil
	case gjson.True:
		emit("true")
		return nil
	case gjson.False:
		emit("false")
		return nil
	}
	switch {
	case res.IsArray():
		// Check the whole array before emitting anything, so that a bad
		// element withdraws the whole rule for this object.
		var bad error
		res.ForEach(func(_, el gjson.Result) bool {
			bad = shape(path, el)
			return bad == nil
		})
		if bad != nil {
			return bad
		}
		res.ForEach(func(_, el gjson.Result) bool {
			_ = each(path, el, emit)
			return true
		})
		return nil
	case res.IsObject():
		return &ShapeError{Path: path, Kind: "an object"}
	default:
		return &ShapeError{Path: path, Kind: "not valid JSON"}
	}
}

// shape checks that a value is a scalar, null or an array of them.
func shape(path string, res gjson.Result) error {
	switch {
	case res.IsObject():
		return &ShapeError{Path: path, Kind: "an array holding an object"}
	case res.IsArray():
		var bad error
		res.ForEach(func(_, el gjson.Result) bool {
			bad = shape(path, el)
			return bad == nil
		})
		return bad
	case res.Type == gjson.JSON:
		return &ShapeError{Path: path, Kind: "not valid JSON"}
	}
	return nil
}

// SinglePath returns the rule's gjson path when the rule is one path and no
// template.
func (r *Rule) SinglePath() (string, bool) {
	if len(r.parts) == 1 && r.parts[0].path != "" {
		return r.parts[0].path, true
	}
	return "", false
}

// Paths returns the gjson paths of the rule, in order.
func (r *Rule) Paths() []string {
	var out []string
	for _, p := range r.parts {
		if p.path != "" {
			out = append(out, p.path)
		}
	}
	return out
}

// HostPath returns the path that a template writes as the host of a
// HOST:PORT value: the path right before a literal that starts with ':'
// (as spec.host in '${spec.host}:${spec.port}' or '${spec.host}:8080').
func (r *Rule) HostPath() (string, bool) {
	for i := 1; i < len(r.parts); i++ {
		if p := r.parts[i]; p.path == "" && strings.HasPrefix(p.literal, ":") && r.parts[i-1].path != "" {
			return r.parts[i-1].path, true
		}
	}
	return "", false
}

// Literals returns the literal text of a template, its parts between
// and around the paths, in order; nil for a rule that is one path.
func (r *Rule) Literals() []string {
	var out []string
	for _, p := range r.parts {
		if p.path == "" {
			out = append(out, p.literal)
		}
	}
	return out
}
