package schema

import (
	"fmt"
	"net"
	"regexp"
	"sort"
	"strings"

	"github.com/hashicorp/go-multierror"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FieldError is one problem of a config, at a field path such as
// "resources[1].indexes[0].key".
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// problems collects FieldErrors.
type problems struct{ err *multierror.Error }

func (p *problems) add(path, format string, args ...any) {
	p.err = multierror.Append(p.err, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// result returns nil, or an error listing every problem, one per line.
func (p *problems) result() error {
	if p.err == nil {
		return nil
	}
	p.err.ErrorFormat = listFormat
	return p.err
}

// listFormat prints one problem per line, with a count first.
func listFormat(errs []error) string {
	lines := make([]string, len(errs))
	for i, err := range errs {
		lines[i] = err.Error()
	}
	noun := "problems"
	if len(errs) == 1 {
		noun = "problem"
	}
	return fmt.Sprintf("%d %s in the config:\n%s", len(errs), noun, strings.Join(lines, "\n"))
}

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

// Validate checks the config and reports every problem at once, each with
// its field path. It returns nil for a valid config.
func (c *Config) Validate() error {
	var p problems
	c.validate(&p)
	return p.result()
}

func (c *Config) validate(p *problems) {
	if c.Server.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Server.Listen); err != nil {
			p.add("server.listen", "%q is not host:port", c.Server.Listen)
		}
	}
	for i, f := range c.CRDs {
		if strings.TrimSpace(f) == "" {
			p.add(fmt.Sprintf("crds[%d]", i), "empty file path")
		}
	}
	if len(c.Resources) == 0 {
		p.add("resources", "no resource is configured; list at least one")
	}
	resources := map[string]string{} // name -> path of its first declaration
	indexes := map[string]string{}
	for i, r := range c.Resources {
		at := fmt.Sprintf("resources[%d]", i)
		p.name(resources, at, r.Name)
		if r.Group != "" {
			for _, msg := range validation.IsDNS1123Subdomain(r.Group) {
				p.add(at+".group", "%q: %s", r.Group, msg)
			}
		}
		if r.Version == "" {
			p.add(at+".version", "required (for example v1)")
		} else if msgs := validation.IsDNS1035Label(r.Version); len(msgs) > 0 {
			p.add(at+".version", "%q: %s", r.Version, msgs[0])
		}
		if r.Resource == "" {
			p.add(at+".resource", "required: the plural resource name (for example appmodels)")
		} else if msgs := validation.IsDNS1123Label(r.Resource); len(msgs) > 0 {
			p.add(at+".resource", "%q: %s", r.Resource, msgs[0])
		}
		if r.Group == "" && r.Resource == "secrets" && !r.AllowSecrets {
			p.add(at+".resource", "watching Secrets puts their content in memory and behind the HTTP API; set allowSecrets: true to do it on purpose")
		}
		if r.Namespace != "" {
			if msgs := validation.IsDNS1123Label(r.Namespace); len(msgs) > 0 {
				p.add(at+".namespace", "%q: %s", r.Namespace, msgs[0])
			}
		}
		if _, err := labels.Parse(r.LabelSelector); err != nil {
			p.add(at+".labelSelector", "%q: %v", r.LabelSelector, err)
		}
		if _, err := fields.ParseSelector(r.FieldSelector); err != nil {
			p.add(at+".fieldSelector", "%q: %v", r.FieldSelector, err)
		}
		if r.Resync < 0 {
			p.add(at+".resync", "%v is negative; use 0 for no resync", r.Resync)
		}
		names := make([]string, 0, len(r.Fields))
		for name := range r.Fields {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			fat := at + ".fields." + name
			if !fieldNameRE.MatchString(name) {
				p.add(fat, "field name %q: use letters, digits and '_'", name)
			}
			if _, err := CompileRule(r.Fields[name]); err != nil {
				p.add(fat, "%v", err)
			}
		}
		if len(r.Indexes) == 0 {
			p.add(at+".indexes", "no index is declared; declare at least one")
		}
		for j, ix := range r.Indexes {
			iat := fmt.Sprintf("%s.indexes[%d]", at, j)
			p.name(indexes, iat, ix.Name)
			if _, err := CompileRule(ix.Key); err != nil {
				p.add(iat+".key", "%v", err)
			}
			if ix.Value != "" {
				if _, err := CompileRule(ix.Value); err != nil {
					p.add(iat+".value", "%v", err)
				}
			}
			if ix.MaxEntriesPerObject < 0 {
				p.add(iat+".maxEntriesPerObject", "%d is negative; omit it (or use 0) for the default of %d", ix.MaxEntriesPerObject, DefaultMaxEntriesPerObject)
			}
		}
	}
	chains := map[string]string{}
	for i, ch := range c.Chains {
		at := fmt.Sprintf("chains[%d]", i)
		p.name(chains, at, ch.Name)
		if len(ch.Indexes) < 2 {
			p.add(at+".indexes", "a chain needs at least two indexes, has %d", len(ch.Indexes))
		}
		for j, name := range ch.Indexes {
			if _, ok := indexes[name]; !ok {
				p.add(fmt.Sprintf("%s.indexes[%d]", at, j), "unknown index %q%s", name, suggest(name, indexes))
			}
		}
	}
}

// name checks the name field of the entry at path at: required, made of
// safe characters, and unique among seen (name -> path of the entry that
// declared it first).
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
