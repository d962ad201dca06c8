package plan

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/tidwall/gjson"
)

// This file checks the syntax of gjson paths before they are used, since
// gjson itself never refuses a path: a path it cannot parse (an unclosed
// query, an unknown modifier, "spec[0]") silently matches nothing, or
// something else than meant. checkGJSONPath follows gjson's own parsing
// (gjson.go of github.com/tidwall/gjson v1.20.2: Get, parseObjectPath,
// parseArrayPath, parseQuery, parseSubSelectors, execModifier, execStatic)
// and refuses only what is certainly a mistake; see gjson's SYNTAX.md.
// (checkPath, in crd.go, follows a path through a CRD's schema.)

// knownModifiers are gjson's built-in modifiers, for messages only: whether
// a modifier exists is asked of gjson.ModifierExists, which also knows the
// modifiers added with gjson.AddModifier.
var knownModifiers = []string{"dig", EndpointsModifier, "flatten", "fromstr", "group", "join", "keys", "pretty", "reverse", "this", "tostr", "ugly", "valid", "values"}

var bracketIndexRE = regexp.MustCompile(`^\[(\d+|\*)\]`)

// checkRule checks every gjson path of a rule, and returns the rule, or an
// error naming the path and what is wrong with it.
func checkRule(r *Rule) (*Rule, error) {
	for _, p := range r.parts {
		if p.path == "" {
			continue
		}
		if err := checkGJSONPath(p.path); err != nil {
			if p.path == r.src {
				return nil, fmt.Errorf("%q: %w", p.path, err)
			}
			return nil, fmt.Errorf("template %q: %q: %w", r.src, p.path, err)
		}
	}
	return r, nil
}

// checkGJSONPath returns an error when gjson cannot evaluate path as written:
// an unclosed query "#(" or multipath "{" or "[", an unknown modifier, a
// leading, trailing or doubled "." or "|", an index written "[0]" (gjson
// writes .0), a stray closing bracket, an unclosed string, a dangling
// escape. Every path of gjson's documented syntax passes.
func checkGJSONPath(path string) error {
	if path == "" {
		return errors.New("empty gjson path")
	}
	if rest, ok := strings.CutPrefix(path, ".."); ok {
		// JSON lines: ".." runs the rest of the path on each line.
		if rest == "" {
			return errors.New(`nothing after the JSON lines prefix ".."`)
		}
		path = rest
	}
	return checkChain(path)
}

// checkChain checks components separated by "." or "|".
func checkChain(p string) error {
	if p == "" {
		return errors.New("empty path")
	}
	if p[0] == '.' || p[0] == '|' {
		return fmt.Errorf("starts with %q", p[:1])
	}
	for {
		rest, err := checkComponent(p)
		if err != nil {
			return err
		}
		if rest == "" {
			return nil
		}
		if rest[0] != '.' && rest[0] != '|' {
			return fmt.Errorf("unexpected %q after %q; separate path components with \".\" or \"|\"", rest[:1], p[:len(p)-len(rest)])
		}
		sep := rest[:1]
		p = rest[1:]
		switch {
		case p == "":
			return fmt.Errorf("ends with %q", sep)
		case p[0] == '.' || p[0] == '|':
			return fmt.Errorf("empty key at %q", sep+p[:1])
		}
	}
}

// checkComponent checks the component at the start of p and returns what
// follows it.
func checkComponent(p string) (rest string, err error) {
	switch p[0] {
	case '@':
		return checkModifier(p)
	case '!':
		return checkLiteral(p)
	case '#':
		if len(p) > 1 && (p[1] == '(' || p[1] == '[') {
			return checkQuery(p)
		}
	case '{', '[':
		return checkMultipath(p)
	case ')', ']', '}':
		return "", fmt.Errorf("unbalanced %q", p[:1])
	}
	return checkKey(p)
}

// checkKey checks an object key or array index, which may hold escapes
// and the wildcards * and ?.
func checkKey(p string) (string, error) {
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '\\':
			if i+1 == len(p) {
				return "", errors.New(`ends with an escape "\"`)
			}
			i++
		case '.', '|':
			return p[i:], nil
		case '[':
			if m := bracketIndexRE.FindStringSubmatch(p[i:]); m != nil {
				repl := m[1]
				if repl == "*" {
					repl = "#"
				}
				return "", fmt.Errorf("%q is not gjson syntax; write %s.%s", m[0], p[:i], repl)
			}
			return "", fmt.Errorf("unexpected %q in key %q; gjson indexes arrays with .0 and .# (escape it as \\%c if it is part of the key)", string(c), keyText(p), c)
		case ']', '{', '}', '(', ')':
			return "", fmt.Errorf("unexpected %q in key %q (escape it as \\%c if it is part of the key)", string(c), keyText(p), c)
		}
	}
	return "", nil
}

// keyText returns the key at the start of p, up to an unescaped "." or "|".
func keyText(p string) string {
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '.', '|':
			return p[:i]
		}
	}
	return p
}

// checkModifier checks a modifier such as @reverse or @pretty:{"indent":"  "}.
func checkModifier(p string) (string, error) {
	i := 1
	for i < len(p) && p[i] != '.' && p[i] != '|' && p[i] != ':' {
		i++
	}
	name := p[1:i]
	if name == "" {
		return "", errors.New(`"@" without a modifier name`)
	}
	if !gjson.ModifierExists(name, nil) {
		hint := Closest(name, knownModifiers)
		if hint != "" {
			hint = " (did you mean @" + hint + "?)"
		} else {
			hint = " (known: @" + strings.Join(knownModifiers, ", @") + ")"
		}
		return "", fmt.Errorf("unknown modifier %q%s", p[:i], hint)
	}
	rest := p[i:]
	check := modifierArgs[name]
	if check == nil {
		check = func(string) error { return nil }
	}
	if rest == "" || rest[0] != ':' {
		return rest, check("")
	}
	arg := rest[1:]
	if arg == "" {
		return "", check("")
	}
	switch arg[0] {
	case '{', '[', '"':
		// A JSON argument; what follows it is the rest of the path.
		n, err := balanced(arg)
		if err != nil {
			return "", fmt.Errorf("argument of %s: %w", p[:i], err)
		}
		return arg[n:], check(arg[:n])
	}
	if modifierArgs[name] != nil {
		return "", check(arg)
	}
	// A plain argument runs to the next "|".
	for j := 0; j < len(arg); j++ {
		switch arg[j] {
		case '|':
			return arg[j:], nil
		case '{', '[', '(', '"':
			n, err := balanced(arg[j:])
			if err != nil {
				return "", fmt.Errorf("argument of %s: %w", p[:i], err)
			}
			j += n - 1
		}
	}
	return "", nil
}

// checkLiteral checks a JSON literal such as !true, !"text", !{"a":1}.
func checkLiteral(p string) (string, error) {
	v := p[1:]
	if v == "" {
		return "", errors.New(`"!" without a literal`)
	}
	switch c := v[0]; {
	case c == '{' || c == '[' || c == '"':
		n, err := balanced(v)
		if err != nil {
			return "", fmt.Errorf("literal: %w", err)
		}
		return v[n:], nil
	case c == '-' || c == '+' || c >= '0' && c <= '9':
		// gjson takes the rest of the path as the number.
		if strings.Trim(v, "+-.0123456789eE") != "" {
			return "", fmt.Errorf("literal %q is not a number", p)
		}
		return "", nil
	}
	i := 0
	for i < len(v) && v[i] != '.' && v[i] != '|' {
		i++
	}
	switch strings.ToLower(v[:i]) {
	case "true", "false", "null", "nan", "inf":
		return v[i:], nil
	}
	return "", fmt.Errorf(`unknown literal %q (want !true, !false, !null, a number, a "string" or JSON; escape "!" as \! if it starts a key)`, p[:i+1])
}

// queryOps are gjson's query operators, longest first.
var queryOps = []string{"==", "!=", "<=", ">=", "!%", "=", "<", ">", "%"}

// checkQuery checks a query #(...) or #(...)#, or its old form #[...].
func checkQuery(p string) (string, error) {
	end, err := closing(p, 1)
	if err != nil {
		return "", fmt.Errorf("query %q: %w", p[:2], err)
	}
	if end < 0 {
		return "", fmt.Errorf("query %q is not closed", p[:2])
	}
	body := p[2:end]
	query := p[:end+1]
	// Split like gjson's parseQuery: the first operator character at the
	// query's own depth, outside strings, starts the value.
	op := -1
	depth := 0
	for i := 0; i < len(body) && op < 0; i++ {
		switch c := body[i]; c {
		case '\\':
			i++
		case '(', '[':
			depth++
		case ')', ']':
			depth--
		case '"':
			i = skipString(body, i) // closed: closing checked it
		case '!', '=', '<', '>', '%':
			if depth == 0 {
				op = i
			}
		}
	}
	qpath := body
	if op >= 0 {
		qpath = body[:op]
	}
	qpath = strings.TrimSpace(qpath)
	if qpath != "" {
		if err := checkGJSONPath(qpath); err != nil {
			return "", fmt.Errorf("query %q: path %q: %w", query, qpath, err)
		}
	} else if op < 0 {
		return "", fmt.Errorf("empty query %q", query)
	}
	if op >= 0 {
		expr := body[op:]
		var sym string
		for _, o := range queryOps {
			if strings.HasPrefix(expr, o) {
				sym = o
				break
			}
		}
		if sym == "" {
			return "", fmt.Errorf("query %q: unknown operator at %q (want ==, !=, <, <=, >, >=, %% or !%%)", query, expr)
		}
		if strings.TrimSpace(expr[len(sym):]) == "" {
			return "", fmt.Errorf("query %q: no value after %q (write \"\" for the empty string)", query, sym)
		}
	}
	return strings.TrimPrefix(p[end+1:], "#"), nil
}

// checkMultipath checks a multipath {a,b,"name":c} or [a,b].
func checkMultipath(p string) (string, error) {
	end, err := closing(p, 0)
	if err != nil {
		return "", fmt.Errorf("multipath %q: %w", p[:1], err)
	}
	if end < 0 {
		return "", fmt.Errorf("multipath %q is not closed", p[:1])
	}
	multi := p[:end+1]
	// Split like gjson's parseSubSelectors: on commas at depth 1, with an
	// optional name before a colon, except in a modifier's argument.
	depth := 0
	start, colon, modifier := 1, -1, false
	var elems []string
	for i := 1; i <= end; i++ {
		switch c := p[i]; c {
		case '\\':
			i++
		case '@':
			if !modifier && (p[i-1] == '.' || p[i-1] == '|') {
				modifier = true
			}
		case ':':
			if !modifier && colon < 0 && depth == 0 {
				colon = i
			}
		case '"':
			i = skipString(p, i) // closed: closing checked it
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			if depth > 0 {
				depth--
				continue
			}
			fallthrough
		case ',':
			if depth > 0 {
				continue
			}
			from := start
			if colon >= 0 {
				from = colon + 1
			}
			elems = append(elems, p[from:i])
			start, colon, modifier = i+1, -1, false
		}
	}
	for _, e := range elems {
		if e == "" {
			return "", fmt.Errorf("multipath %q has an empty path", multi)
		}
		if err := checkGJSONPath(e); err != nil {
			return "", fmt.Errorf("multipath %q: path %q: %w", multi, e, err)
		}
	}
	return p[end+1:], nil
}

// closing returns the index of the bracket that closes the one at p[at],
// or -1 if none does. Escapes and strings are skipped; brackets must nest.
func closing(p string, at int) (int, error) {
	stack := []byte{p[at]}
	for i := at + 1; i < len(p); i++ {
		switch c := p[i]; c {
		case '\\':
			i++
		case '"':
			j := skipString(p, i)
			if j < 0 {
				return 0, fmt.Errorf("string %s is not closed", p[i:])
			}
			i = j
		case '(', '[', '{':
			stack = append(stack, c)
		case ')', ']', '}':
			open := stack[len(stack)-1]
			if want := closer(open); c != want {
				return 0, fmt.Errorf("%q closes %q; want %q", string(c), string(open), string(want))
			}
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return i, nil
			}
		}
	}
	return -1, nil
}

func closer(open byte) byte {
	switch open {
	case '(':
		return ')'
	case '[':
		return ']'
	}
	return '}'
}

// balanced returns the length of the JSON value at the start of p, which
// starts with '"', '{' or '[': a string, or brackets that close.
func balanced(p string) (int, error) {
	if p[0] == '"' {
		j := skipString(p, 0)
		if j < 0 {
			return 0, fmt.Errorf("string %s is not closed", p)
		}
		return j + 1, nil
	}
	end, err := closing(p, 0)
	if err != nil {
		return 0, err
	}
	if end < 0 {
		return 0, fmt.Errorf("%q is not closed", p[:1])
	}
	return end + 1, nil
}

// skipString returns the index of the quote that closes the string whose
// opening quote is p[i], or -1.
func skipString(p string, i int) int {
	for j := i + 1; j < len(p); j++ {
		switch p[j] {
		case '\\':
			j++
		case '"':
			return j
		}
	}
	return -1
}
