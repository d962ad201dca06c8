// Package sync is metasync's engine: one watch per configured resource,
// each object projected to the fields its rules need, and the results fed
// into the named reverse indexes of package indexer, from which it answers
// lookups and tells subscribers of every change.
//
// The package name shadows the standard library's sync; import it under
// another name where both are needed:
//
//	import msync "github.com/iidp/metasync/sync"
//
// # Words
//
// A resource is one entry of the config's resources (one watch); an object
// key is namespace/name (or name); an index maps index keys ("model1") to
// index values ("base"); a chain follows indexes in a row; fields are an
// object's projected fields. docs/glossary.md is the project's one
// glossary, with the three meanings of "snapshot" told apart.
//
// # Life of an Engine
//
// New builds an Engine from a schema.Plan and a *rest.Config; it talks to
// no cluster yet. Start runs every watch until its context ends, and
// returns once every goroutine it started has exited. WaitForSync returns
// once every resource has completed its first list: every object written
// before Start is then visible. A resource whose watch keeps failing stays
// served from memory and is reported not ready (Status, Ready).
//
// With Options.SnapshotDir, New first restores what the engine's last run
// wrote there: lookups answer at once, Stale until each watch has resumed
// from the snapshot's resourceVersion (or listed, when the apiserver
// cannot resume it), and Start writes a snapshot every SnapshotInterval
// and when it stops. WaitForData returns once every resource has data,
// from a list or a snapshot; WaitForSync once every one has caught up.
// With several clusters, each cluster's part is restored and caught up
// on its own, checked against that cluster's identity.
//
// # Reading
//
// What the engine answers is the Reader interface: Lookup, Resolve, Keys,
// Indexes, Chains, the projected fields of objects (decoded by Objects,
// Object and List), and Subscribe. Every read may run in any number of
// goroutines, takes no lock and never blocks the watches; a returned slice
// is shared and must not be modified. Nothing outside the engine writes to
// its indexes. Code written against Reader is unit-tested with
// metasynctest.Fake, built from the same config and objects given as YAML,
// without a cluster.
//
// # The face
//
// An Engine shows the Reader and its life (Start, WaitForData,
// WaitForSync, Reload, Ready, Stale, Status, Clusters). What the daemon's
// faces read besides — answers with their freshness, each cluster's part,
// conflicts, counts, snapshots, memory upkeep — is on the Inspector that
// Engine.Inspect returns: the same engine, seen wider.
//
// # Subscribing
//
// Subscribe follows one key of an index (KeyOf), one key of a chain
// (ChainOf, which follows every step) or every key of an index (IndexOf):
// first the current answer, then each change, taken with
// Subscription.Next. A slow subscriber never slows the watches or other
// subscribers and holds no backlog: the changes it has not taken yet
// collapse into the newest answer. Versions let a subscriber resume where
// it left off. See Engine.Subscribe for the guarantees.
package sync
