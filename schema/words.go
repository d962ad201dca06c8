package schema

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/go-viper/mapstructure/v2"
)

// This file says the decoder's problems in the config's words: what a
// field wants and what the file gave ("want a string, got a mapping"),
// never a Go type; and it tells an entry that sits under the wrong list
// (a resource entry appended after chains:) by its keys.

// decodeMsg is the message of a decoder error inner, in the config's
// words.
func decodeMsg(inner error) string {
	var ute *mapstructure.UnconvertibleTypeError
	if errors.As(inner, &ute) {
		return fmt.Sprintf("want %s, got %s", wantWords(ute.Expected.Type()), gotWords(ute.Value))
	}
	var pe *mapstructure.ParseError
	if errors.As(inner, &pe) {
		return fmt.Sprintf("want %s, got %s", wantWords(pe.Expected.Type()), gotWords(pe.Value))
	}
	return cleanDecodeMsg(inner.Error())
}

// wantWords names what a field of Go type t takes, in the config's words.
func wantWords(t reflect.Type) string {
	if t == durationType {
		return "a duration (such as 300s or 5m)"
	}
	t = derefType(t)
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		if derefType(t.Elem()).Kind() == reflect.String {
			return "a list of strings"
		}
		return "a list"
	case reflect.Map:
		if derefType(t.Elem()).Kind() == reflect.String {
			return "a mapping of names to strings (name: value lines)"
		}
		return "a mapping (key: value lines)"
	case reflect.Struct:
		return "a mapping (key: value lines)"
	}
	return "another kind of value"
}

// gotWords names what the file gave, in the config's words.
func gotWords(v any) string {
	switch x := v.(type) {
	case nil:
		return "nothing"
	case string:
		return fmt.Sprintf("%q", x)
	case bool:
		return fmt.Sprintf("%v (true or false)", x)
	case int, int64, uint64, float64:
		return fmt.Sprintf("the number %v", x)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping (key: value lines)"
	}
	switch reflect.ValueOf(v).Kind() {
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map:
		return "a mapping (key: value lines)"
	}
	return fmt.Sprintf("%v", v)
}

// kindWords replaces the kind names of mapstructure's own messages.
var kindWords = strings.NewReplacer(
	`got map`, `got a mapping (key: value lines)`,
	`got slice`, `got a list`,
	`got string`, `got a string`,
	`got "map"`, `got a mapping (key: value lines)`,
	`got "slice"`, `got a list`,
	`got "string"`, `got a string`,
	`got "int"`, `got a number`,
	`got int`, `got a number`,
	`got "bool"`, `got true or false`,
	`got bool`, `got true or false`,
	`got "float64"`, `got a number`,
	`got float64`, `got a number`,
)

// cleanDecodeMsg drops mapstructure's Go type names where a user would not
// know them.
func cleanDecodeMsg(msg string) string {
	msg = strings.ReplaceAll(msg, "expected type 'string'", "want a string")
	msg = strings.ReplaceAll(msg, "source data must be an array or slice", "want a list")
	msg = strings.ReplaceAll(msg, "expected a map or struct", "want a mapping (key: value lines)")
	return kindWords.Replace(msg)
}

// resourceOnlyKeys are keys that only a resource entry has.
var resourceOnlyKeys = func() []string {
	var keys []string
	for _, f := range koanfFields(reflect.TypeFor[Resource]()) {
		if f.key != "name" && f.key != "indexes" {
			keys = append(keys, f.key)
		}
	}
	return keys
}()

// misplaced finds entries of the raw config (as the file gives it) that
// sit under the wrong list: a resource entry under chains: (its keys are
// a resource's, or its indexes are mappings), a chain entry under
// resources: (only a name and a list of index names). It returns, per
// entry path, the problem that replaces every problem inside that entry.
func misplaced(raw map[string]any) map[string]string {
	out := map[string]string{}
	if chains, ok := raw["chains"].([]any); ok {
		for i, c := range chains {
			m, ok := c.(map[string]any)
			if !ok {
				continue
			}
			var own []string
			for _, k := range resourceOnlyKeys {
				if _, ok := m[k]; ok {
					own = append(own, k)
				}
			}
			if len(own) == 0 && !listOf[map[string]any](m["indexes"]) {
				continue
			}
			why := "its indexes are index entries"
			if len(own) > 0 {
				sort.Strings(own)
				why = "it has " + strings.Join(own, ", ")
			}
			out[fmt.Sprintf("chains[%d]", i)] = fmt.Sprintf("this looks like a resource entry (%s), under chains:. "+
				"Is it under chains: by mistake? Resource entries go under resources: (an entry added at the end of the file "+
				"lands in the last list, often chains:)", why)
		}
	}
	if resources, ok := raw["resources"].([]any); ok {
		for i, r := range resources {
			m, ok := r.(map[string]any)
			if !ok || !listOf[string](m["indexes"]) {
				continue
			}
			keys := slices.Sorted(maps.Keys(m))
			if !slices.Equal(keys, []string{"indexes", "name"}) && !slices.Equal(keys, []string{"indexes"}) {
				continue
			}
			out[fmt.Sprintf("resources[%d]", i)] = "this looks like a chain entry (a name and a list of index names), under resources:. " +
				"Is it under resources: by mistake? Chains go under chains:"
		}
	}
	return out
}

// listOf reports whether v is a non-empty list whose elements are all Ts.
func listOf[T any](v any) bool {
	l, ok := v.([]any)
	if !ok || len(l) == 0 {
		return false
	}
	for _, e := range l {
		if _, ok := e.(T); !ok {
			return false
		}
	}
	return true
}

// within returns the entry of entries that path lies in ("" if none):
// the entry itself, or a field or element inside it.
func within(path string, entries map[string]string) string {
	for e := range entries {
		if path == e || strings.HasPrefix(path, e+".") || strings.HasPrefix(path, e+"[") {
			return e
		}
	}
	return ""
}
