// Package plan holds the compiled form of a metasync config: the gjson rules
// and the resource, index and chain entries the engine runs. Package schema
// builds it (schema.Compile), in one pass with validation, and hands it out
// only inside a schema.Plan; package sync reads it through Of. Nothing
// outside the module can name these types, so nothing outside the module
// can change a plan after it was compiled.
//
// Words: a resource entry is one element of the config's resources list
// (one watch); an index entry is one (index key, index value) pair that an
// object contributes (see package indexer).
package plan

import (
	"time"

	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
)

// DefaultMaxEntries is the default bound of the index entries that one
// object may contribute to one index, and of what one field's rule may yield.
const DefaultMaxEntries = 10000

// BytesPerEntry bounds the bytes of an object's entries in one index: on
// average this much per entry of the entry bound.
const BytesPerEntry = 128

// Plan is a compiled, valid config.
type Plan struct {
	Resources []*Resource // in config order
	Chains    []*Chain    // in config order
	// Clusters, in config order; none: one cluster, the engine's own
	// connection, and object keys without a cluster.
	Clusters []Cluster
}

// Cluster is one cluster of a plan that reads several.
type Cluster struct {
	Name       string
	Kubeconfig string // "": the engine's own connection
	Context    string
	Required   bool
	Home       bool
	DropAfter  time.Duration
}

// ClustersOf returns the names of the clusters that watch r: r.Clusters,
// or every cluster of p when r names none; nil for a plan without
// clusters.
func (p *Plan) ClustersOf(r *Resource) []string {
	if len(r.Clusters) > 0 {
		return r.Clusters
	}
	out := make([]string, len(p.Clusters))
	for i, c := range p.Clusters {
		out[i] = c.Name
	}
	return out
}

// Resource is one compiled resource entry.
type Resource struct {
	Name          string
	GVR           k8sschema.GroupVersionResource
	Namespace     string
	LabelSelector string // canonical form, "" for everything
	FieldSelector string // canonical form, "" for everything
	Resync        time.Duration
	Fields        []Field // sorted by name
	Indexes       []Index
	Clusters      []string // narrows the plan's Clusters; none: all
}

// Field is one projected field.
type Field struct {
	Name string
	Rule *Rule
}

// Index is one compiled index.
type Index struct {
	Name  string
	Key   *Rule
	Value *Rule // nil: the object key
	// MaxEntries and MaxBytes bound the entries one object contributes
	// and their size; always positive.
	MaxEntries, MaxBytes int
	// Fallback names the index that holds this index's fallback values
	// (the config's `fallback`): a key that no object gives a value
	// answers its values there. FallbackOf, on that index, names the index
	// it backs: such an index follows the one it backs in Resource.Indexes,
	// is named FallbackName(it), and is no index of the config's: it is
	// neither listed nor looked up by its name.
	Fallback, FallbackOf string
	// Hints names the index that holds this index's hints (the config's
	// `hints`): under each key, "VALUE\tKIND=NAME" strings that tag its
	// values with where they serve, for callers that say where they are.
	// HintsOf, on that index, names the index it serves; it is hidden as a
	// fallback is, follows the index (and its fallback) and is named
	// HintsName(it).
	Hints, HintsOf string
	// Unique: a key answers the oldest claimant's values (the config's
	// `unique`).
	Unique bool
}

// HintsName is the name of the index that holds the hints of the index
// named index.
func HintsName(index string) string { return index + "/hints" }

// FallbackName is the name of the index that holds the fallback values of
// the index named index: a name that no index of a config can have.
func FallbackName(index string) string { return index + "/fallback" }

// Public returns the name of the config's index that ix is, or backs.
func (ix *Index) Public() string {
	switch {
	case ix.FallbackOf != "":
		return ix.FallbackOf
	case ix.HintsOf != "":
		return ix.HintsOf
	}
	return ix.Name
}

// Hidden reports whether ix is a fallback or hints index: no index of the
// config's, read only through the index it serves.
func (ix *Index) Hidden() bool { return ix.FallbackOf != "" || ix.HintsOf != "" }

// Limit returns the bound of one rule of the index on one object.
func (ix *Index) Limit() Limit { return Limit{Values: ix.MaxEntries, Bytes: ix.MaxBytes} }

// FieldLimit bounds what a field's rule may yield on one object, as the
// default entry bound bounds an index.
var FieldLimit = Limit{Values: DefaultMaxEntries, Bytes: DefaultMaxEntries * BytesPerEntry}

// Chain is one compiled chain: the names of its indexes, in order.
type Chain struct {
	Name    string
	Indexes []string
}

// Of returns the compiled form of a *schema.Plan (passed as any, since
// schema imports this package). Package schema sets it when it is
// initialized, before any package that imports schema can call it.
var Of func(schemaPlan any) *Plan
