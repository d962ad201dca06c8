// Package indexer keeps named reverse indexes in memory: a pure data
// structure that knows nothing of Kubernetes.
//
// # Vocabulary
//
// Four kinds of strings appear in this package, and each has one name (as
// in docs/glossary.md, the project's one glossary):
//
//   - object key: the identity of one source object, unique within its
//     source (metasync uses "namespace/name", or "name" for cluster-scoped
//     objects).
//   - index name: the name of one index, unique within a Store.
//   - index key: what a lookup asks for ("model2").
//   - index value: what a lookup answers ("base"). An object contributes
//     (index key, index value) pairs, called entries, to each index of its
//     source.
//
// A lookup of an index key answers the distinct index values that any
// object contributes under that key, sorted. Two objects that contribute
// the same value keep it alive until both have withdrawn it.
//
// # Sources
//
// Indexes are grouped by source: the objects of one source (one watched
// resource) feed the indexes declared for it, and a replace-all of the
// source (a relist) removes every object of that source that the new list
// lacks. An object may also carry an opaque payload (metasync keeps the
// projected fields there), readable by object key.
//
// # Concurrency
//
// Any number of readers run concurrently with writers and never block:
// a reader loads an immutable snapshot with one atomic load. The writers
// of one source are serialized, by its own lock; the writers of different
// sources work at once, and wait for each other only to publish (a short
// step: a relist of 100,000 objects builds under its source's lock, and
// publishes what it built). Reconfigure and Compact take every lock. A
// transaction ([Txn]) is published as a whole by Commit, so a reader sees
// either none or all of it, never half of one object's update.
// An index is a hash table split into pages that are copied on write, so
// the cost of a write grows with the page it touches, not with the whole
// index (up to 4096 pages: past about 262,144 keys, pages grow with the
// index). A lookup hashes its key once and reads one page; it allocates
// nothing and takes no lock.
//
// # Commits
//
// Every commit publishes a snapshot numbered one higher than the one it
// replaces (Snapshot.Seq). Store.OnCommit registers the one function that
// hears, in commit order, which index keys each commit changed: metasync's
// subscriptions are built on it.
package indexer
