// Package feed drives a sync.Engine without a cluster: objects go in as
// the apiserver would list and watch them, through the same projection and
// rules as a watch. Package sync implements it (New is set when sync is
// initialized); package metasynctest and the module's tests use it.
package feed

import (
	"log/slog"

	"github.com/iidp/metasync/schema"
)

// Feeder writes objects, as JSON, into an engine built by New. An object
// that its resource entry's namespace or selectors exclude is not seen, as
// the apiserver would not send it; one that stops matching is removed.
type Feeder interface {
	// Apply adds or replaces objects of the named resource entry.
	Apply(resource string, objects ...[]byte) error
	// Delete removes objects by object key (namespace/name, or name).
	Delete(resource string, objectKeys ...string) error
	// Replace makes the objects the resource's whole content, as a relist
	// does: what they lack is removed.
	Replace(resource string, objects ...[]byte) error
	// Reload switches the engine to plan, as a config reload does: the
	// resources it keeps keep their objects; those it starts or restarts
	// begin empty and synced (no cluster to list them from: feed them).
	Reload(plan *schema.Plan) (schema.Changes, error)
	// In feeds one cluster's part of each resource, for a plan that reads
	// several (Apply, Delete and Replace then write only that part; its
	// object keys are those of the cluster, without its name). The
	// Feeder that New returns feeds the home cluster's part.
	In(cluster string) Feeder
}

// New builds a *sync.Engine (returned as any, since sync imports this
// package) of plan that never talks to a cluster, every resource empty and
// synced but those named in unsynced, which are synced by their first
// Replace (a first list), and the Feeder that fills it.
var New func(plan *schema.Plan, log *slog.Logger, unsynced ...string) (engine any, f Feeder, err error)
