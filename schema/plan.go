package schema

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/iidp/metasync/internal/plan"
)

// Plan is a compiled, valid config: what sync.New runs. The only way to get
// one is Compile (or LoadPlan), so holding a Plan means the config passed
// validation. A Plan cannot be changed: its compiled rules are the engine's
// business and are not exported, and what it answers is a copy.
type Plan struct {
	server Server
	crds   []string
	c      *plan.Plan
}

func init() {
	plan.Of = func(p any) *plan.Plan {
		if sp, ok := p.(*Plan); ok && sp != nil {
			return sp.c
		}
		return nil
	}
}

// Compile validates the config and compiles it into a Plan, in one pass.
// The error lists every problem, one per line, each with its field path
// (see Problems and FieldError).
func Compile(c *Config) (*Plan, error) {
	var p problems
	out := c.compile(&p)
	if err := p.result(); err != nil {
		return nil, err
	}
	return out, nil
}

// Validate reports every problem of the config at once, each with its
// field path, as Compile does; nil for a valid config.
func (c *Config) Validate() error {
	_, err := Compile(c)
	return err
}

// Server returns the server settings, with defaults applied.
func (p *Plan) Server() Server { return p.server }

// CRDs returns the CRD files to install at start.
func (p *Plan) CRDs() []string { return slices.Clone(p.crds) }

// compile checks c, adding every problem to p, and builds the plan as it
// goes; the plan is only meaningful when p stays empty.
func (c *Config) compile(p *problems) *Plan {
	out := &Plan{server: c.Server, crds: slices.Clone(c.CRDs), c: &plan.Plan{}}
	if out.server.Listen == "" {
		out.server.Listen = DefaultListen
	} else if _, _, err := net.SplitHostPort(c.Server.Listen); err != nil {
		p.add("server.listen", "%q is not host:port", c.Server.Listen)
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
	clusters := c.compileClusters(p, out.c)
	for i := range c.Resources {
		at := fmt.Sprintf("resources[%d]", i)
		r := c.Resources[i].compile(p, at, resources, indexes)
		seen := map[string]bool{}
		for j, name := range c.Resources[i].Clusters {
			cat := fmt.Sprintf("%s.clusters[%d]", at, j)
			switch {
			case len(c.Clusters) == 0:
				p.add(cat, "the config lists no clusters: declare them in the top-level clusters, or drop this")
			case clusters[name] == "":
				p.add(cat, "unknown cluster %q%s", name, suggest(name, clusters))
			case seen[name]:
				p.add(cat, "cluster %q named twice", name)
			}
			seen[name] = true
			r.Clusters = append(r.Clusters, name)
		}
		out.c.Resources = append(out.c.Resources, r)
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
		out.c.Chains = append(out.c.Chains, &plan.Chain{Name: ch.Name, Indexes: slices.Clone(ch.Indexes)})
	}
	return out
}

// compileClusters checks the config's clusters into cp and returns their
// names.
func (c *Config) compileClusters(p *problems, cp *plan.Plan) map[string]string {
	names := map[string]string{}
	own, homes := 0, 0
	for i, cl := range c.Clusters {
		at := fmt.Sprintf("clusters[%d]", i)
		if cl.Name == "" {
			p.add(at+".name", "required: a DNS label such as east")
		} else if msgs := validation.IsDNS1123Label(cl.Name); len(msgs) > 0 {
			p.add(at+".name", "%q: %s", cl.Name, msgs[0])
		} else if first, ok := names[cl.Name]; ok {
			p.add(at+".name", "cluster %q declared twice (first at %s)", cl.Name, first)
		} else {
			names[cl.Name] = at
		}
		if cl.Kubeconfig == "" {
			own++
			if own == 2 {
				p.add(at+".kubeconfig", "required: only one cluster is the daemon's own connection (the one without kubeconfig)")
			}
			if cl.Context != "" {
				p.add(at+".context", "a context needs a kubeconfig: the daemon's own connection takes its context from --context")
			}
		} else if strings.TrimSpace(cl.Kubeconfig) == "" {
			p.add(at+".kubeconfig", "empty file path")
		}
		if cl.Home {
			homes++
			if homes == 2 {
				p.add(at+".home", "only one cluster is the home")
			}
		}
		if cl.DropAfter < 0 {
			p.add(at+".dropAfter", "%v is negative; omit it for never", cl.DropAfter)
		}
		cp.Clusters = append(cp.Clusters, plan.Cluster{Name: cl.Name, Kubeconfig: cl.Kubeconfig, Context: cl.Context,
			Required: cl.Required == nil || *cl.Required, Home: cl.Home || cl.Kubeconfig == "", DropAfter: cl.DropAfter})
	}
	if own > 0 && homes > 0 {
		for i, cl := range c.Clusters {
			if cl.Home && cl.Kubeconfig != "" {
				p.add(fmt.Sprintf("clusters[%d].home", i), "the home is the cluster without kubeconfig (the daemon's own connection)")
			}
		}
	}
	return names
}

// compile checks the resource entry at path at and compiles it. resources
// and indexes hold the names seen so far, for uniqueness.
func (r *Resource) compile(p *problems, at string, resources, indexes map[string]string) *plan.Resource {
	rp := &plan.Resource{
		Name:      r.Name,
		GVR:       k8sschema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource},
		Namespace: r.Namespace,
		Resync:    r.Resync,
	}
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
		p.policy++
	}
	if r.Namespace != "" {
		if msgs := validation.IsDNS1123Label(r.Namespace); len(msgs) > 0 {
			p.add(at+".namespace", "%q: %s", r.Namespace, msgs[0])
		}
	}
	if sel, err := labels.Parse(r.LabelSelector); err != nil {
		p.add(at+".labelSelector", "%q: %v", r.LabelSelector, err)
	} else if !sel.Empty() {
		rp.LabelSelector = sel.String()
	}
	if sel, err := fields.ParseSelector(r.FieldSelector); err != nil {
		p.add(at+".fieldSelector", "%q: %v", r.FieldSelector, err)
	} else if !sel.Empty() {
		rp.FieldSelector = sel.String()
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
		rule, err := plan.CompileRule(r.Fields[name])
		if err != nil {
			p.add(fat, "%v", err)
		}
		rp.Fields = append(rp.Fields, plan.Field{Name: name, Rule: rule})
	}
	if len(r.Indexes) == 0 {
		p.add(at+".indexes", "no index is declared; declare at least one")
	}
	for j, ix := range r.Indexes {
		iat := fmt.Sprintf("%s.indexes[%d]", at, j)
		p.name(indexes, iat, ix.Name)
		ir := plan.Index{Name: ix.Name, MaxEntries: ix.MaxEntriesPerObject, Unique: ix.Unique}
		if ix.Unique && (ix.Fallback != "" || ix.Hints != "") {
			p.add(iat+".unique", "a unique index cannot have a fallback or hints: its answer is one object's values; drop unique, or the fallback and hints")
		}
		var err error
		if ir.Key, err = plan.CompileRule(ix.Key); err != nil {
			p.add(iat+".key", "%v", err)
		}
		if ix.Value != "" {
			if ir.Value, err = plan.CompileRule(ix.Value); err != nil {
				p.add(iat+".value", "%v", err)
			}
		}
		switch {
		case ix.MaxEntriesPerObject < 0:
			p.add(iat+".maxEntriesPerObject", "%d is negative; omit it (or use 0) for the default of %d", ix.MaxEntriesPerObject, DefaultMaxEntriesPerObject)
		case ix.MaxEntriesPerObject == 0:
			ir.MaxEntries = DefaultMaxEntriesPerObject
		}
		ir.MaxBytes = ir.MaxEntries * BytesPerEntry
		// A fallback and hints are indexes of their own, keyed as the
		// index is, hidden behind it (plan.Index.Hidden).
		companion := func(field, src, name string, set func(*plan.Index)) *plan.Index {
			if src == "" {
				return nil
			}
			rule, err := plan.CompileRule(src)
			if err != nil {
				p.add(iat+"."+field, "%v", err)
			}
			c := &plan.Index{Name: name, Key: ir.Key, Value: rule, MaxEntries: ir.MaxEntries, MaxBytes: ir.MaxBytes}
			set(c)
			return c
		}
		fb := companion("fallback", ix.Fallback, plan.FallbackName(ix.Name), func(c *plan.Index) { ir.Fallback, c.FallbackOf = c.Name, ix.Name })
		hints := companion("hints", ix.Hints, plan.HintsName(ix.Name), func(c *plan.Index) { ir.Hints, c.HintsOf = c.Name, ix.Name })
		rp.Indexes = append(rp.Indexes, ir)
		if fb != nil {
			rp.Indexes = append(rp.Indexes, *fb)
		}
		if hints != nil {
			rp.Indexes = append(rp.Indexes, *hints)
		}
	}
	return rp
}
