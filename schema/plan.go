package schema

import (
	"slices"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
)

// Plan is a compiled, valid config. The only way to get one is Compile (or
// Load), so holding a Plan means the config passed validation. A Plan is
// read-only.
type Plan struct {
	config    Config
	resources []*ResourcePlan
	chains    []*ChainPlan
}

// ResourcePlan is one compiled resource entry.
type ResourcePlan struct {
	Name          string
	GVR           k8sschema.GroupVersionResource
	Namespace     string
	LabelSelector string // canonical form, "" for everything
	FieldSelector string // canonical form, "" for everything
	Resync        time.Duration
	Fields        []FieldRule // sorted by name
	Indexes       []IndexRule
}

// FieldRule is one projected field.
type FieldRule struct {
	Name string
	Rule *Rule
}

// IndexRule is one compiled index.
type IndexRule struct {
	Name  string
	Key   *Rule
	Value *Rule // nil: the object key
	// MaxEntries and MaxBytes bound the entries one object contributes
	// and their size (see Index.MaxEntriesPerObject); always positive.
	MaxEntries, MaxBytes int
}

// Limit returns the bound of one rule of the index on one object.
func (ir *IndexRule) Limit() Limit { return Limit{Values: ir.MaxEntries, Bytes: ir.MaxBytes} }

// FieldLimit bounds what a field's rule may yield on one object, as the
// default entry limit bounds an index.
var FieldLimit = Limit{Values: DefaultMaxEntriesPerObject, Bytes: DefaultMaxEntriesPerObject * BytesPerEntry}

// ChainPlan is one compiled chain.
type ChainPlan struct {
	Name    string
	Indexes []string
}

// Compile validates the config and compiles it into a Plan. The error lists
// every problem, one per line (see Problems).
func Compile(c *Config) (*Plan, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	p := &Plan{config: *c}
	if p.config.Server.Listen == "" {
		p.config.Server.Listen = DefaultListen
	}
	for _, r := range c.Resources {
		rp := &ResourcePlan{
			Name:      r.Name,
			GVR:       k8sschema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource},
			Namespace: r.Namespace,
			Resync:    r.Resync,
		}
		// Validate has parsed both selectors already.
		if sel, _ := labels.Parse(r.LabelSelector); !sel.Empty() {
			rp.LabelSelector = sel.String()
		}
		if sel, _ := fields.ParseSelector(r.FieldSelector); !sel.Empty() {
			rp.FieldSelector = sel.String()
		}
		for name, path := range r.Fields {
			rule, _ := CompileRule(path)
			rp.Fields = append(rp.Fields, FieldRule{Name: name, Rule: rule})
		}
		sort.Slice(rp.Fields, func(i, j int) bool { return rp.Fields[i].Name < rp.Fields[j].Name })
		for _, ix := range r.Indexes {
			ir := IndexRule{Name: ix.Name, MaxEntries: ix.MaxEntriesPerObject}
			if ir.MaxEntries == 0 {
				ir.MaxEntries = DefaultMaxEntriesPerObject
			}
			ir.MaxBytes = ir.MaxEntries * BytesPerEntry
			ir.Key, _ = CompileRule(ix.Key)
			if ix.Value != "" {
				ir.Value, _ = CompileRule(ix.Value)
			}
			rp.Indexes = append(rp.Indexes, ir)
		}
		p.resources = append(p.resources, rp)
	}
	for _, ch := range c.Chains {
		p.chains = append(p.chains, &ChainPlan{Name: ch.Name, Indexes: slices.Clone(ch.Indexes)})
	}
	return p, nil
}

// Resources returns the compiled resources, in config order.
func (p *Plan) Resources() []*ResourcePlan { return p.resources }

// Chains returns the compiled chains, in config order.
func (p *Plan) Chains() []*ChainPlan { return p.chains }

// Server returns the server settings, with defaults applied.
func (p *Plan) Server() Server { return p.config.Server }

// CRDs returns the CRD files to install at start.
func (p *Plan) CRDs() []string { return p.config.CRDs }

// Config returns the config the plan was compiled from.
func (p *Plan) Config() Config { return p.config }
