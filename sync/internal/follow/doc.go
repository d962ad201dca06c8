// Package follow is one resource of the engine followed in one cluster:
// its list and watch through client-go's reflector (listwatch.go,
// resume.go), each object reduced to what the indexes and fields need
// (codec.go, framer.go, project.go) and written into its indexer.Source
// (store.go), the rules that fail per object (failing.go), and the
// cluster's identity that tells a rebuilt cluster behind the same
// address (identity.go, trouble.go).
//
// A Watcher is built by the engine (package sync), which sets its
// callbacks and shared state before Run, reads its Status, and stops it
// with Halt. The package knows nothing of the engine: what it needs of
// it comes in as fields (Cluster, Changed, Recovered, Freshened).
//
// Where a watcher stands in an outage of its apiserver (failing, cut off,
// its cluster's part dropped) is one value, its Phase, changed only
// by the transitions that phase.go draws.
//
// Files stand in one direction: watcher.go holds the Watcher's state and
// nothing that acts on it; the files that act on it stand above it, and
// run.go, its run loop and status, near the top.
package follow
