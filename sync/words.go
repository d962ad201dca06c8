package sync

import (
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"
)

// EventType says what an Event is.
type EventType int

// The events of a subscription, in the order a subscriber meets them.
const (
	// EventReset: the subscription could not resume from Target.Resume
	// (see Subscribe); what the subscriber held is void, and a full
	// snapshot follows as at a first subscription.
	EventReset EventType = iota + 1
	// EventSnapshot: the current answer of one key, when the
	// subscription starts. A key or chain subscription gets one, values
	// empty when there are none; an index subscription one per key that
	// has values.
	EventSnapshot
	// EventSynced: an index subscription has received its whole initial
	// state (after its snapshots, or after the updates of a resume).
	EventSynced
	// EventUpdate: the answer of a key changed; Values empty when the key
	// has none any more.
	EventUpdate
	// EventGone: a reload removed the index or chain; the subscription
	// ends (Next returns ErrClosed after it).
	EventGone
)

func (t EventType) String() string {
	switch t {
	case EventReset:
		return "reset"
	case EventSnapshot:
		return "snapshot"
	case EventSynced:
		return "synced"
	case EventUpdate:
		return "update"
	case EventGone:
		return "gone"
	}
	return "EventType(" + strconv.Itoa(int(t)) + ")"
}

// Event is one message of a subscription.
type Event struct {
	Type EventType
	// Key is the index or chain key of a snapshot or update.
	Key string
	// Values is the answer of Key: distinct, sorted, nil when none. It is
	// shared: do not modify it.
	Values []string
	// Version identifies the state the subscriber holds after this event:
	// give it back as Target.Resume to resume. It is opaque; compare it
	// for equality only.
	Version string
}

// Target is what a subscription follows: one key of an index, one key of
// a chain, or every key of an index. Build it with KeyOf, ChainOf or
// IndexOf.
type Target struct {
	Index string // with Key: one key of an index; alone: every key
	Chain string // with Key: one key of a chain
	Key   string
	All   bool // every key of Index
	// Resume, when set, is the Version of the last event that an earlier
	// subscription to the same target delivered: the new subscription
	// sends only what changed since (nothing when nothing did), or, when
	// it cannot resume from there, an EventReset and a full snapshot.
	Resume string
	// At, for a key or a chain key, is where the subscriber runs: its
	// answers are narrowed by the indexes' hints as LookupAt narrows them.
	At Locality
	// Cluster, for a key or a chain key of a plan that reads several
	// clusters, narrows the answer to that cluster's part: the values
	// that its objects give (at each step of a chain, to the keys that
	// its part of the step before gave), which Inspector.AnswerIn tells
	// too. With At, the part is narrowed to the values preferred for the
	// locality when some of it is, else the whole part. It reads as a
	// lookup reads (each cluster's values are indexed as it writes
	// them), and a subscription hears of a change of the cluster's part
	// even when the whole answer stays the same. "" is every cluster.
	Cluster string
}

// KeyOf targets one key of an index.
func KeyOf(index, key string) Target { return Target{Index: index, Key: key} }

// ChainOf targets one key of a chain: the subscription follows every step.
func ChainOf(chain, key string) Target { return Target{Chain: chain, Key: key} }

// IndexOf targets every key of an index, to mirror it.
func IndexOf(index string) Target { return Target{Index: index, All: true} }

// ErrClosed is what Next returns once the subscription is closed, by Close
// or by the end of the context given to Subscribe.
var ErrClosed = errors.New("subscription closed")

// IndexInfo describes one index.
type IndexInfo struct {
	Name     string
	Resource string // the resource entry that feeds it
	Keys     int
	// Synced: the resource has completed a list, so that an empty answer
	// means "no values", not "not known yet".
	Synced bool
	// Stale: its resource answers from a snapshot that its watch has not
	// caught up with yet (a warm start, see Stale), or what it last knew
	// while its watch has failed longer than Options.StaleAfter.
	Stale bool
	// Failing is the number of objects whose rule fails now for this
	// index (they add nothing to it), LastRuleError the latest of those
	// failures; nil when none fails.
	Failing       int
	LastRuleError *RuleFailure
	// Unique: the index answers one object's values per key (the
	// config's `unique`); Conflicts counts its keys claimed with
	// different values by several objects (see Inspector.Conflicts).
	Unique    bool
	Conflicts int
}

// ChainInfo describes one chain.
type ChainInfo struct {
	Name    string
	Indexes []string
	Synced  bool // every index of the chain is synced
}

// ObjectFields is one object's projected fields (its resource's `fields`).
type ObjectFields struct {
	// Key is the object's key: namespace/name, or name when
	// cluster-scoped, never prefixed by its cluster.
	Key  string
	JSON string // a JSON object, field name to value; a missing value is left out
	// Cluster is the cluster the object is of, for a plan that reads
	// several ("" otherwise): one Key may name an object in each of
	// several clusters, each its own ObjectFields.
	Cluster string
}

// Locality is where a caller runs, for topology-aware answers: its zone
// (topology.kubernetes.io/zone of its node) and its node's name. The zero
// Locality is nowhere in particular.
type Locality struct {
	Zone, Node string
}

// prefer returns the hint tags of l, the node's first (see
// indexer.Snapshot.LookupPreferring).
func (l Locality) prefer() []string {
	var out []string
	if l.Node != "" {
		out = append(out, "node="+l.Node)
	}
	if l.Zone != "" {
		out = append(out, "zone="+l.Zone)
	}
	return out
}

// Answer is the answer of a lookup or a chain with what it is worth, as
// the HTTP API gives it.
type Answer struct {
	Values []string
	// Synced: every resource behind the answer has completed a list, so
	// that no values means "none", not "not known yet".
	Synced bool
	// Stale: some resource answers from a snapshot that has not caught
	// up with the apiserver yet, or is cut off from it (its watch failing
	// longer than Options.StaleAfter).
	Stale bool
	// Seq numbers the state of the indexes that the answer was read
	// from: each commit is one higher, it never goes backwards while the
	// engine runs, and answers read by one call of Answers share it. A
	// face that numbers its answers (the Consul facade's X-Consul-Index)
	// reads it: an answer that differs from one read at Seq n was read at
	// a Seq above n.
	Seq uint64
	// Clusters is the state of each cluster's part of the answer, for a
	// plan that reads several clusters (nil otherwise): Synced is then
	// true when every required cluster's part is, Stale when any is.
	Clusters map[string]ClusterState
}

// FieldsAnswer is objects' projected fields with the flags that say how
// far to trust them, read as Answer reads values with theirs.
type FieldsAnswer struct {
	Objects []ObjectFields
	// Synced: the index (or the resource) has completed a list, so that
	// no object means none, not "not known yet".
	Synced bool
	// Stale: the engine answers from data that may be behind the
	// apiserver (see Stale).
	Stale bool
}

// Explanation is an answer with where it comes from: for each index that
// a lookup or a chain lookup follows, the keys it looked up, the values
// it found, and the objects that gave them (Engine.Explain).
type Explanation struct {
	Answer
	Steps []ExplainStep
}

// ExplainStep is one index of an explained answer, in the order the chain
// follows them (a lookup has one).
type ExplainStep struct {
	Index  string
	Keys   []string // the keys looked up: the key, or the last step's values
	Values []string // distinct, sorted: the next step's keys
	// Objects gave the step its values, ordered by key looked up, then
	// oldest first. On a unique index, every claimant of a key in
	// conflict is listed, and the one answered is Chosen.
	Objects []ExplainedObject
	// Conflicts lists the keys of the step in conflict (a unique index).
	Conflicts []string
	// Synced and Stale are the index's (see IndexInfo).
	Synced, Stale bool
	// Empty says why a step found no values: ExplainUnknownKey,
	// ExplainNotSynced or ExplainStale; "" when it found some.
	Empty string
}

// Why an explained step found nothing.
const (
	// ExplainUnknownKey: the index is synced and no object gives the keys
	// a value.
	ExplainUnknownKey = "no object gives this key a value"
	// ExplainNotSynced: the index's resource has not completed a list:
	// the key may have values not read yet.
	ExplainNotSynced = "the index's resource is not synced: values may not be read yet"
	// ExplainStale: the index answers from a snapshot its watch has not
	// caught up with.
	ExplainStale = "the index answers from a snapshot not caught up with the apiserver"
	// ExplainNotInCluster: of an explanation narrowed to a cluster
	// (Target.Cluster), no object of that cluster gives the keys a
	// value (another cluster's objects may).
	ExplainNotInCluster = "no object of this cluster gives this key a value"
	// ExplainUnknownIndex: no index (or chain) of that name.
	ExplainUnknownIndex = "no index of that name"
	// ExplainYounger: a claimant of a key in conflict whose values are
	// not answered: an older one's are.
	ExplainYounger = "a younger claimant of a unique index: the oldest's values are answered"
	// ExplainElsewhere: values hinted for another zone or node than the
	// caller's (topology-aware routing, Target.At); Why adds the
	// caller's, as "(zone=a)".
	ExplainElsewhere = "hinted for another zone or node than the caller's"
	// ExplainShadowed: values of the index's fallback (for EndpointSlices:
	// serving terminating endpoints), not answered while the key has
	// values of its own (ready endpoints).
	ExplainShadowed = "the index's fallback (serving terminating endpoints): not answered while the key has values of its own (ready endpoints)"
)

// ExplainedObject is one object behind a step's values.
type ExplainedObject struct {
	Resource string // the resource entry
	// Key is the object's key: namespace/name, or name, never prefixed
	// by its cluster.
	Key string
	// Cluster is the cluster the object is of, for a plan that reads
	// several ("" otherwise): objects of one Key in several clusters are
	// each listed, each with its Cluster.
	Cluster         string
	ResourceVersion string // of the object, as its values were read
	// Created is the object's creationTimestamp (zero when unknown): on
	// a unique index, the oldest claimant of a key is answered.
	Created  time.Time
	IndexKey string   // the key of the step it gives values to
	Values   []string // what it gives that key
	// Chosen: on a key in conflict, this object's values are answered.
	Chosen bool
	// Fallback: these are the index's fallback values (for
	// EndpointSlices: serving terminating endpoints), answered when the
	// key has no values of its own, else unanswered (ExplainShadowed).
	Fallback bool
	// Unanswered are the values it gives that its key does not answer,
	// and Why: ExplainYounger, ExplainElsewhere (with the caller's zone or
	// node) or ExplainShadowed.
	Unanswered []string
	Why        string
}

// Conflict is the keys in conflict of one unique index.
type Conflict struct {
	Index string
	Keys  []string // sorted
}

// ClusterState is the state of one cluster's part of an answer.
type ClusterState struct {
	Synced bool
	Stale  bool
}

// ClusterStatus is the state of one cluster of a plan that reads several
// (GET /v1/clusters).
type ClusterStatus struct {
	Name     string
	Home     bool
	Required bool
	// Connected: the last request of every resource of the cluster to
	// its apiserver worked (a list, or a watch established), and Error is
	// the first failing one's error ("" when connected); true of a cluster
	// that no resource entry reads. A resource's own error
	// (ResourceStatus.Error) stays until a watch is established.
	Connected bool
	// Synced: every resource of the cluster has completed a list.
	Synced bool
	// Stale: some resource of the cluster is cut off from it (its watch
	// failing longer than Options.StaleAfter), answering what it last knew.
	Stale bool
	// LastContact is when the cluster last answered (the latest
	// established watch or completed list of its resources); zero before.
	LastContact time.Time
	Objects     int
	Error       string
	// KubeconfigRotations counts the cluster's kubeconfig files taken
	// after the first (see Options.KubeconfigInterval);
	// KubeconfigErrors those refused (unreadable, invalid, or refused by
	// their apiserver), which keep the last good connection, and
	// KubeconfigError the latest refusal since the last file taken.
	KubeconfigRotations int64
	KubeconfigErrors    int64
	KubeconfigError     string
}

// ResourceStatus is the state of one resource entry.
type ResourceStatus struct {
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
	// gone back in time (etcd restored from a backup); see rebuilt.go.
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

// RuleFailure is the last rule error of an index that still holds: the
// object it failed for (Object: namespace/name, or name when
// cluster-scoped, never prefixed by its cluster; Cluster: its cluster,
// of a plan that reads several), what the rule said (Error) and when
// (At). It is ResourceStatus.LastRuleError's and
// ObjectFields.LastRuleError's.
type RuleFailure = follow.RuleFailure

// SnapshotFile is the name of the snapshot in Options.SnapshotDir.
const SnapshotFile = "snapshot"

// SnapshotStatus is the state of an engine's snapshots.
type SnapshotStatus struct {
	// Load is how the engine started: "warm" (from a snapshot), "cold"
	// (LoadReason says why), or "" when no snapshot was asked for. With
	// several clusters it is warm while some cluster's part is (see
	// Clusters): cold "missing" when the snapshot has none of theirs,
	// cold "cluster" once every part restored was dropped.
	Load       string
	LoadReason string
	// WrittenAt is when the newest snapshot written or loaded was
	// written: its data is that old at most. Zero when there is none.
	WrittenAt time.Time
	// The last write: how long it took, its size, and its error if it
	// failed.
	Writes        int64
	WriteErrors   int64
	WriteDuration time.Duration
	Bytes         int64
	Objects       int
	WriteError    string
	// Clusters, of a config that reads several, is how each cluster's
	// part started, in config order; nil otherwise.
	Clusters []ClusterLoad
}

// ClusterLoad is how one cluster's part of the data started, of a config
// that reads several clusters: Load is "warm" (its part restored from
// the snapshot) or "cold"; LoadReason says why it is cold: "missing" (the
// snapshot has no part of the cluster: a cluster added since, or one that
// had not synced), "cluster" (the snapshot's part came from another
// cluster: its identity changed; the part was dropped), or the reason of
// the whole snapshot's cold start.
type ClusterLoad struct {
	Name       string
	Load       string
	LoadReason string
}

// ErrNothingToSnapshot: no resource has synced yet, WriteSnapshot wrote
// nothing.
var ErrNothingToSnapshot = errors.New("no resource has synced yet: nothing to snapshot")

// SnapshotError is why a snapshot was not used: Reason is one word (for
// metrics): missing, truncated, checksum, format, corrupt, config, or
// unreadable.
type SnapshotError struct {
	Reason string
	Err    error
}

func (e *SnapshotError) Error() string { return e.Err.Error() }

func (e *SnapshotError) Unwrap() error { return e.Err }

// setCluster records how a cluster's part started.
// Once no cluster's part is warm, the whole start is cold ("cluster"),
// as a start of one cluster whose identity changed is.
func (st *SnapshotStatus) setCluster(name, load, reason string) {
	i := slices.IndexFunc(st.Clusters, func(c ClusterLoad) bool { return c.Name == name })
	if i < 0 {
		st.Clusters = append(st.Clusters, ClusterLoad{Name: name})
		i = len(st.Clusters) - 1
	}
	st.Clusters[i].Load, st.Clusters[i].LoadReason = load, reason
	if st.Load == "warm" && !slices.ContainsFunc(st.Clusters, func(c ClusterLoad) bool { return c.Load == "warm" }) {
		st.Load, st.LoadReason, st.WrittenAt = "cold", "cluster", time.Time{}
	}
}
