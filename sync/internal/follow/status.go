package follow

import "time"

// Status is sync.ResourceStatus as a watcher fills it: the engine
// converts one into the other, so the two keep the same fields, in the
// same order (see sync.ResourceStatus for what each means).
type Status struct {
	Name           string
	Cluster        string
	Optional       bool
	GVR            string
	Namespace      string
	Ready          bool
	Reason         string
	Syncing        bool
	Synced         bool
	Stale          bool
	SyncedAt       time.Time
	Objects        int
	Error          string
	ErrorSince     time.Time
	Added          int64
	Updated        int64
	Deleted        int64
	Relists        int64
	ClusterChanges int64
	ListErrors     int64
	WatchErrors    int64
	Watches        int64
	Listed         int64
	Lists          int64
	ListSeconds    float64
	WatchesEnded   int64
	WatchSeconds   float64
	RuleErrors     map[string]int64
	Failing        map[string]int
	LastRuleError  map[string]RuleFailure
}
