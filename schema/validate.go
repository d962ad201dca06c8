package schema

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/hashicorp/go-multierror"

	plist "github.com/iidp/metasync/schema/internal/problems"
)

// FieldError is one problem of a config, at a field path such as
// "resources[1].indexes[0].key".
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// problems collects FieldErrors.
type problems struct {
	list plist.List
	// policy counts the problems of policy (a Secrets entry without
	// allowSecrets): the plan compiled despite them is whole.
	policy int
}

func (p *problems) add(path, format string, args ...any) {
	p.list.Add(&FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// result returns nil, or an error listing every problem, one per line.
func (p *problems) result() error { return p.list.Err("in the config") }

// Problems returns the single problems of an error returned by Load,
// Validate or Compile (or the error itself when it is not a list).
func Problems(err error) []error {
	if err == nil {
		return nil
	}
	if me, ok := err.(*multierror.Error); ok {
		return me.WrappedErrors()
	}
	return []error{err}
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)
var fieldNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// name checks the name field of the resource, index or chain entry at
// path at: required, made of safe characters, and unique among seen (name
// -> path of the entry that declared it first).
func (p *problems) name(seen map[string]string, at, name string) {
	switch {
	case name == "":
		p.add(at+".name", "required")
	case !nameRE.MatchString(name):
		p.add(at+".name", "%q: use letters, digits, '.', '_' and '-'", name)
	default:
		if first, dup := seen[name]; dup {
			p.add(at+".name", "%q is already the name of %s", name, first)
		} else {
			seen[name] = at
		}
	}
}

// suggest names the known indexes, to help with a typo.
func suggest(name string, known map[string]string) string {
	if len(known) == 0 {
		return ""
	}
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, k)
	}
	sort.Strings(names)
	return " (known: " + strings.Join(names, ", ") + ")"
}
