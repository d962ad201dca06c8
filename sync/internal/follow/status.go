package follow

import "time"

// Status is sync.ResourceStatus as a watcher fills it: the engine
// converts one into the other, so the two keep the same fields, in the
// same order (see sync.ResourceStatus for what each means).
type Status struct {
	Name string
	// Cluster is the cluster of this part of the resource, in a config
	// that reads several (one status per resource and cluster); "" else.
	Cluster string
	// Optional: the cluster is not required (its resources do not hold
	// back the engine's readiness).
	Optional  bool
	GVR       string
	Namespace string
	// Ready is Synced, and the resource has not gone longer than
	// Options.StaleAfter without an established watch since its first
	// error; Reason says why not.
	Ready  bool
	Reason string
	// Syncing: a reload added the resource, or changed its definition,
	// and its first list since has not completed yet but still may: its
	// resource is served and it has not failed for StaleAfter. An added
	// one is not Synced, answers nothing yet, and does not count against
	// the engine's readiness (Engine.Ready) while Syncing. A changed one
	// answers from its previous definition meanwhile and counts as any
	// synced resource does: not ready once its watch has failed
	// StaleAfter, or at once when its new resource is not served.
	Syncing bool
	// Synced: the resource has data to answer with, from a complete list
	// or from a snapshot (Options.SnapshotDir).
	Synced bool
	// Stale: its data came from a snapshot and its watch has not caught
	// up with the apiserver yet, or its watch has failed longer than
	// Options.StaleAfter (cut off: Error says why); it is not Ready
	// meanwhile.
	Stale    bool
	SyncedAt time.Time
	Objects  int
	// Error is the last list or watch error, "" once a watch is
	// established again (it stayed open a second without an error);
	// a list that works does not clear it.
	Error string
	// ErrorSince is when the trouble began: the first error since a watch
	// was last established.
	ErrorSince time.Time
	// Events applied, by type, and complete lists (relists included).
	Added   int64
	Updated int64
	Deleted int64
	Relists int64
	// ClusterChanges counts the lists from scratch because the cluster
	// behind the address changed: rebuilt (another kube-system UID) or
	// gone back in time (etcd restored from a backup); see sync/rebuilt.go.
	ClusterChanges int64
	// Failed list and watch requests; WatchErrors also counts watches
	// that ended with an ERROR event or before they were established.
	ListErrors  int64
	WatchErrors int64
	// Watches counts the watch requests that started (restarts included).
	Watches int64
	// Listed is the number of objects decoded by the current or last list,
	// to show progress of a long initial sync.
	Listed int64
	// Lists counts the list requests that ended (each page of a paged
	// list apart; a stop's not), ListSeconds their time in all;
	// WatchesEnded counts the watches that ended, WatchSeconds how long
	// they stayed open in all. Short watches and a high rate of lists
	// show a resource that cannot keep a watch.
	Lists        int64
	ListSeconds  float64
	WatchesEnded int64
	WatchSeconds float64
	// RuleErrors counts, per index, objects whose rule could not be
	// evaluated (an object where a string was wanted, say).
	RuleErrors map[string]int64
	// Failing counts, per index, the objects whose rule fails now: they
	// add nothing to it until an event or a list gives them again with
	// rules that work, or they are deleted. LastRuleError is the latest
	// failure of each of those indexes. An index none of whose objects
	// fails is in neither.
	Failing       map[string]int
	LastRuleError map[string]RuleFailure
}
