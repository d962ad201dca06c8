// Package schema holds metasync's configuration: the Go types of the config
// file, its loading (koanf: defaults, file, environment, flags), its
// validation (every problem at once, each with its field path) and its
// compilation into a Plan of gjson rules that the engine runs.
//
// Library users may skip the file and build a Config as a Go literal:
//
//	plan, err := schema.Compile(&schema.Config{Resources: []schema.Resource{{
//		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
//		Namespace: "meta-test", LabelSelector: "iidp=iidp",
//		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
//	}}})
//
// schema starts no goroutines and talks to no cluster, except for the CRD
// helpers that say so.
package schema

import (
	"time"

	"github.com/iidp/metasync/internal/plan"
)

// DefaultListen is the daemon's default listen address: loopback only.
const DefaultListen = "127.0.0.1:8080"

// Config is the whole configuration, as in the config file.
type Config struct {
	Server Server `koanf:"server"`
	// CRDs lists CRD manifest files to install at start and wait for. Off
	// unless listed: it needs create rights on CRDs.
	CRDs      []string   `koanf:"crds"`
	Resources []Resource `koanf:"resources"`
	Chains    []Chain    `koanf:"chains"`
	// Clusters lists the clusters to read; none: the daemon's own
	// connection alone (see Cluster).
	Clusters []Cluster `koanf:"clusters"`
}

// Cluster is one cluster of a config that reads several: every resource
// entry is watched in each (unless the entry's Clusters narrows it), and
// the answers are the union of what every cluster gives.
type Cluster struct {
	// Name is unique in the config, a DNS label: answers, metrics, logs
	// and /readyz name the cluster by it.
	Name string `koanf:"name"`
	// Kubeconfig is the file of the cluster's connection; "" is the
	// daemon's own connection (--kubeconfig, KUBECONFIG, in-cluster),
	// which at most one cluster has, and which makes it the home.
	Kubeconfig string `koanf:"kubeconfig"`
	// Context is the kubeconfig context to use; "" for its current one.
	Context string `koanf:"context"`
	// Required: /readyz and an answer's synced wait for this cluster.
	// Default true.
	Required *bool `koanf:"required"`
	// Home marks the home cluster where every cluster has a kubeconfig.
	Home bool `koanf:"home"`
	// DropAfter, when positive, removes an unreachable cluster's part of
	// the answers after that long; default never.
	DropAfter time.Duration `koanf:"dropAfter"`
}

// Server configures the daemon's HTTP server.
type Server struct {
	// Listen is the address of the HTTP API (default DefaultListen).
	Listen string `koanf:"listen"`
}

// Resource is one watched resource: one watch, with its own namespace and
// selectors, feeding its indexes.
type Resource struct {
	// Name is unique in the config; metrics, logs and /readyz use it.
	Name string `koanf:"name"`
	// Group is the API group, "" for the core group.
	Group    string `koanf:"group"`
	Version  string `koanf:"version"`
	Resource string `koanf:"resource"` // plural
	// Namespace limits the watch to one namespace; "" watches all.
	Namespace     string `koanf:"namespace"`
	LabelSelector string `koanf:"labelSelector"`
	FieldSelector string `koanf:"fieldSelector"`
	// Resync, when positive, relists the resource this long after each
	// complete list: a full LIST whose result replaces the resource's
	// indexes. A list that takes longer is never cut short.
	Resync time.Duration `koanf:"resync"`
	// Fields projects each object for typed access: field name -> gjson
	// path (or template). Only these fields are kept in memory.
	Fields  map[string]string `koanf:"fields"`
	Indexes []Index           `koanf:"indexes"`
	// AllowSecrets must be true for a resource entry that watches Secrets: their
	// projected content would sit in memory and behind the HTTP API.
	AllowSecrets bool `koanf:"allowSecrets"`
	// Clusters narrows the entry to these clusters of the config's
	// Clusters; none: every cluster.
	Clusters []string `koanf:"clusters"`
}

// Index is one named reverse index over a resource's objects.
type Index struct {
	// Name is unique across the whole config.
	Name string `koanf:"name"`
	// Key is a gjson path, or a template of paths in ${...}, giving the index
	// keys of an object; an array gives one key per element.
	Key string `koanf:"key"`
	// Value gives the index values, like Key. Empty means the object key
	// (namespace/name, or name for cluster-scoped objects).
	Value string `koanf:"value"`
	// Fallback, when set, gives values like Value, which a key answers
	// only when no object gives it a value by Value: a key's answer is its
	// values, else its fallback values, else nothing. EndpointSlices use
	// it for Kubernetes' rule that a service with no ready endpoint
	// answers its serving terminating ones:
	//   value: '@endpoints'
	//   fallback: '@endpoints:{"terminating":true}'
	Fallback string `koanf:"fallback"`
	// Hints, when set, gives strings "VALUE\tzone=NAME" (or node=NAME)
	// that tag the values of a key with where they serve: a caller that
	// says where it runs (?zone=, ?node=) gets the values tagged for it,
	// when every value of the answer is tagged and some are for it, and
	// every value otherwise (kube-proxy's topology-aware routing).
	// EndpointSlices give them with @endpoints:{"hints":true} (plus the
	// value's own "port"), from the slices' hints.forZones and forNodes.
	Hints string `koanf:"hints"`
	// MaxEntriesPerObject bounds the (key, value) entries that one object
	// may contribute to this index: keys × values, and every combination
	// of a template; and their size, at most BytesPerEntry per entry on
	// average. An object over either contributes nothing to the index and
	// counts a rule error, so that one hostile or broken object cannot
	// exhaust memory. 0 means DefaultMaxEntriesPerObject.
	MaxEntriesPerObject int `koanf:"maxEntriesPerObject"`
	// Unique says that each key has one value (a model is served by one
	// app): when several objects give a key different values, the key
	// answers the values of the oldest of them (metadata.creationTimestamp,
	// then the object key), never a mix, and the key is counted in
	// conflict (metric metasync_index_conflicting_keys, /readyz?verbose,
	// ?explain). A unique index has no fallback or hints.
	Unique bool `koanf:"unique"`
}

// DefaultMaxEntriesPerObject is the default of Index.MaxEntriesPerObject:
// far above what a real object contributes (an EndpointSlice holds at most
// 1,000 endpoints), far below what exhausts a pod's memory.
const DefaultMaxEntriesPerObject = plan.DefaultMaxEntries

// BytesPerEntry is the average size of an entry (key and value) that
// MaxEntriesPerObject allows: an object's entries in one index may take
// MaxEntriesPerObject × BytesPerEntry bytes in all (1.25 MiB by default),
// so that a few long strings repeated in every entry cannot multiply an
// object's size by the entry limit.
const BytesPerEntry = plan.BytesPerEntry

// Chain resolves a key through several indexes: each step's values are the
// next step's keys.
type Chain struct {
	Name    string   `koanf:"name"`
	Indexes []string `koanf:"indexes"`
}
