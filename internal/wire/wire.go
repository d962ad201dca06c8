// Package wire declares what the daemon's HTTP API sends: its answers, its
// errors and the frames of its streams, once, for the server
// (cmd/metasync/internal/server) and for every client of it in this tree
// (the CLI, internal/streamclient, grpcresolver's remote resolver,
// hack/bench).
// The design pins the form ("HTTP API", "Change streams"); a field added
// here is added for all of them.
//
// A field that a client must tell apart from its absence is a pointer:
// Values and Keys (an answer without them is not a lookup), Synced (absent
// once synced).
package wire

import (
	"encoding/json"
	"time"
)

// The types of a stream's frames.
const (
	// FrameSnapshot is a stream's first frame: the target's values (an
	// index stream: one per key).
	FrameSnapshot = "snapshot"
	// FrameSynced follows the snapshots of an index stream (or the
	// updates of its resume): the client holds the whole index.
	FrameSynced = "synced"
	// FrameUpdate carries the target's values after a change.
	FrameUpdate = "update"
	// FrameReset says that the versions the client holds are void (the
	// daemon restarted, or the stream resumed too late): a snapshot follows.
	FrameReset = "reset"
	// FrameHeartbeat keeps an idle stream open, with the current version.
	FrameHeartbeat = "heartbeat"
	// FrameGone ends a stream whose index or chain a reload removed.
	FrameGone = "gone"
)

// Frame is one line of a stream.
type Frame struct {
	Type    string    `json:"type"`
	Index   string    `json:"index,omitempty"`
	Chain   string    `json:"chain,omitempty"`
	Key     *string   `json:"key,omitempty"`
	Values  *[]string `json:"values,omitempty"`
	Version string    `json:"version,omitempty"`
	// Stale: some resource answers from a snapshot and has not caught up
	// with the apiserver yet (a warm start).
	Stale bool `json:"stale,omitempty"`
	// Clusters, with a config that reads several clusters: each
	// cluster's part of the target, synced and stale.
	Clusters map[string]ClusterState `json:"clusters,omitempty"`
}

// Lookup is the answer of GET /v1/indexes/{index}/keys/{key}, and, with
// Chain instead of Index, of GET /v1/chains/{chain}/keys/{key}.
type Lookup struct {
	Index  string    `json:"index,omitempty"`
	Chain  string    `json:"chain,omitempty"`
	Key    string    `json:"key"`
	Values *[]string `json:"values"`
	// Synced is false while the resource (of a chain: some resource of
	// it) has never completed a list: an empty answer then means "not
	// known yet", not "no values". It is absent otherwise.
	Synced *bool `json:"synced,omitempty"`
	// Stale: answered from a snapshot not caught up yet.
	Stale bool `json:"stale,omitempty"`
	// Clusters, with a config that reads several clusters: each
	// cluster's part of the answer, synced and stale.
	Clusters map[string]ClusterState `json:"clusters,omitempty"`
	// Steps, with ?explain=true: where the values come from, one step per
	// index in the order the chain follows them.
	Steps []Step `json:"steps,omitempty"`
}

// ClusterState is one cluster's part of an answer.
type ClusterState struct {
	Synced bool `json:"synced"`
	Stale  bool `json:"stale"`
}

// Clusters is the answer of GET /v1/clusters.
type Clusters struct {
	Clusters []Cluster `json:"clusters"`
}

// Cluster is one cluster of GET /v1/clusters.
type Cluster struct {
	Name     string `json:"name"`
	Home     bool   `json:"home"`
	Required bool   `json:"required"`
	// Connected: every resource's watch of the cluster works.
	Connected bool `json:"connected"`
	Synced    bool `json:"synced"`
	// Stale: some resource is cut off from the cluster, answering what
	// it last knew.
	Stale       bool       `json:"stale"`
	LastContact *time.Time `json:"lastContact,omitempty"`
	Objects     int        `json:"objects"`
	Error       string     `json:"error,omitempty"`
	// The cluster's kubeconfig files taken after the first, and refused
	// (the last good connection stays), with the latest refusal.
	KubeconfigRotations int64  `json:"kubeconfigRotations,omitempty"`
	KubeconfigErrors    int64  `json:"kubeconfigErrors,omitempty"`
	KubeconfigError     string `json:"kubeconfigError,omitempty"`
}

// Step is one index of an explained answer ("Explain" in the design).
type Step struct {
	Index  string   `json:"index"`
	Keys   []string `json:"keys"`
	Values []string `json:"values"`
	// Objects gave the values: by key looked up, then oldest first.
	Objects []StepObject `json:"objects"`
	// Conflicts: the keys of the step claimed with different values by
	// several objects of a unique index.
	Conflicts []string `json:"conflicts,omitempty"`
	// Synced is false while the index's resource has not listed; Stale
	// as for the answer.
	Synced bool `json:"synced"`
	Stale  bool `json:"stale,omitempty"`
	// Empty says why the step found no values.
	Empty string `json:"empty,omitempty"`
}

// StepObject is one object behind a step's values.
type StepObject struct {
	Resource string `json:"resource"`
	// Key is the object's key, namespace/name (or name), never prefixed
	// by its cluster; Cluster, of a config with clusters:, the cluster
	// the object is of.
	Key             string `json:"key"`
	Cluster         string `json:"cluster,omitempty"`
	ResourceVersion string `json:"resourceVersion"`
	// CreationTimestamp orders the claimants of a unique index.
	CreationTimestamp *time.Time `json:"creationTimestamp,omitempty"`
	// IndexKey is the key of the step the object gives values to.
	IndexKey string   `json:"indexKey"`
	Values   []string `json:"values"`
	// Chosen: of the claimants of a key in conflict, the one answered.
	Chosen bool `json:"chosen,omitempty"`
	// Fallback: the key has no values of its own; these are its
	// fallback's (serving terminating endpoints).
	Fallback bool `json:"fallback,omitempty"`
	// Unanswered: its values the step does not answer, and why (a younger
	// claimant; hinted for another zone or node).
	Unanswered []string `json:"unanswered,omitempty"`
	Why        string   `json:"why,omitempty"`
}

// Keys is the answer of GET /v1/indexes/{index}/keys: a page of the
// index's keys, sorted.
type Keys struct {
	Index string    `json:"index"`
	Keys  *[]string `json:"keys"`
	// Continue, when set, is the value of ?continue= for the next page:
	// an opaque token, never empty.
	Continue string `json:"continue,omitempty"`
	Synced   *bool  `json:"synced,omitempty"`
	Stale    bool   `json:"stale,omitempty"`
}

// Index describes one index in the answer of GET /v1/indexes.
type Index struct {
	Name     string `json:"name"`
	Resource string `json:"resource"`
	Keys     int    `json:"keys"`
	Synced   bool   `json:"synced"`
	// Stale: the index's resource answers from data that may be behind
	// the apiserver: a warm start's snapshot its watch has not caught up with.
	Stale bool `json:"stale,omitempty"`
	// Failing: the objects whose rule fails now for the index (they add
	// nothing to it); LastRuleError the latest of those failures.
	Failing       int          `json:"failing,omitempty"`
	LastRuleError *RuleFailure `json:"lastRuleError,omitempty"`
	// Unique index: its keys in conflict (claimed with different values
	// by several objects; each answers the oldest claimant's).
	Unique    bool `json:"unique,omitempty"`
	Conflicts int  `json:"conflicts,omitempty"`
}

// RuleFailure is a rule that fails for an object: which object, what the
// rule said, and when.
type RuleFailure struct {
	Object string `json:"object"` // namespace/name (or name)
	// Cluster is the object's, of a config with clusters:.
	Cluster string    `json:"cluster,omitempty"`
	Error   string    `json:"error"`
	At      time.Time `json:"at"`
}

// Indexes is the answer of GET /v1/indexes.
type Indexes struct {
	Indexes []Index `json:"indexes"`
	Stale   bool    `json:"stale,omitempty"`
}

// Error is the body of every answer that is not 200.
type Error struct {
	Error string `json:"error"`
}

// Chain describes one chain in the answer of GET /v1/chains.
type Chain struct {
	Name    string   `json:"name"`
	Indexes []string `json:"indexes"`
	// Synced: every index of the chain is synced.
	Synced bool `json:"synced"`
}

// Chains is the answer of GET /v1/chains.
type Chains struct {
	Chains []Chain `json:"chains"`
	Stale  bool    `json:"stale,omitempty"`
}

// Object is the answer of GET /v1/resources/{resource}/objects/{key}: one
// object's projected fields (its resource entry's `fields`).
type Object struct {
	Resource string `json:"resource"`
	// Key is the object's key, namespace/name (or name), never prefixed
	// by its cluster; Cluster, of a config with clusters:, the cluster
	// the object is of.
	Key     string          `json:"key"`
	Cluster string          `json:"cluster,omitempty"`
	Fields  json.RawMessage `json:"fields"`
	// Objects, when the key names an object in several clusters (and
	// ?cluster= names none), is each of them, by cluster name; Key,
	// Cluster and Fields are then the first's.
	Objects []ObjectFields `json:"objects,omitempty"`
	Stale   bool           `json:"stale,omitempty"`
}

// ObjectFields is one object of an Objects answer, or of an Object's
// several clusters.
type ObjectFields struct {
	Key     string          `json:"key"` // namespace/name (or name), never prefixed by its cluster
	Cluster string          `json:"cluster,omitempty"`
	Fields  json.RawMessage `json:"fields"`
}

// Objects is the answer of GET /v1/indexes/{index}/keys/{key}/objects: the
// objects that give the key, sorted by object key.
type Objects struct {
	Index   string         `json:"index"`
	Key     string         `json:"key"`
	Objects []ObjectFields `json:"objects"`
	Synced  *bool          `json:"synced,omitempty"`
	Stale   bool           `json:"stale,omitempty"`
}

// TargetGroup is one element of the answer of GET /v1/sd/chains/{chain}
// and GET /v1/sd/indexes/{index}, in Prometheus' http_sd format: one key's
// host:port values, labelled with the chain or index and the key
// (__meta_metasync_chain or __meta_metasync_index, __meta_metasync_key;
// __meta_metasync_stale "true" while the answer is stale).
type TargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// ResourceHealth is one resource of GET /readyz?verbose.
type ResourceHealth struct {
	Name     string `json:"name"`
	Cluster  string `json:"cluster,omitempty"`
	Optional bool   `json:"optional,omitempty"`
	Ready    bool   `json:"ready"`
	Synced   bool   `json:"synced"`
	Objects  int    `json:"objects"`
	Reason   string `json:"reason,omitempty"`
	Syncing  bool   `json:"syncing,omitempty"`
	Stale    bool   `json:"stale,omitempty"`
	// Indexes: each index of the resource, with the objects whose rule
	// fails now and the latest of those failures.
	Indexes []IndexHealth `json:"indexes,omitempty"`
}

// IndexHealth is one index of a ResourceHealth.
type IndexHealth struct {
	Name          string       `json:"name"`
	Failing       int          `json:"failing"`
	LastRuleError *RuleFailure `json:"lastRuleError,omitempty"`
}

// ConflictHealth is one unique index's keys in conflict, of GET
// /readyz?verbose.
type ConflictHealth struct {
	Index string   `json:"index"`
	Count int      `json:"count"`
	Keys  []string `json:"keys"`
}

// XDSClient is what one connected xDS client holds, of GET
// /v1/xds/clients: its node, and per resource type the names it asked
// for, the version last sent, the last it acknowledged, and the last it
// rejected with why.
type XDSClient struct {
	Node string `json:"node"`
	// User is who the client authenticated as; Denied the access URLs
	// of the targets it asked for and may not read (with an Authorizer).
	User   string   `json:"user,omitempty"`
	Denied []string `json:"denied,omitempty"`
	// Unknown are the names it asked for that no index or chain answers
	// (a misspelt target), each with why.
	Unknown   []XDSUnknown       `json:"unknown,omitempty"`
	Zone      string             `json:"zone,omitempty"`
	Connected time.Time          `json:"connected"`
	Types     map[string]XDSType `json:"types"`
}

// XDSType is one resource type of an XDSClient.
type XDSType struct {
	Names    []string `json:"names"`
	Sent     string   `json:"sent,omitempty"`
	Acked    string   `json:"acked,omitempty"`
	Rejected string   `json:"rejected,omitempty"`
	Why      string   `json:"why,omitempty"`
}

// XDSUnknown is a resource name that an xDS client asked for and that no
// index or chain answers (a misspelt target).
type XDSUnknown struct {
	// Name is the resource name as the client asked for it.
	Name string `json:"name"`
	// Error says why, with the closest name that exists.
	Error string `json:"error"`
}
