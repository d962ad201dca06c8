package sync

// Inspector is the engine as the daemon's faces read it: everything of
// the Engine, and what an HTTP API, an xDS server or a facade adds to the
// Reader — answers with their freshness and version (Answers), each
// cluster's part (AnswerIn, ClusterStates), whether an index or a chain
// exists and is synced, conflicts, the subscriptions' counts, the
// snapshots' state, and the memory upkeep of a long-running process
// (Compact, Writes).
//
// A program that only reads (a library user's code, written against
// Reader) needs none of it; Engine keeps to the Reader and the lifecycle,
// and Engine.Inspect hands out this wider view. Every method may run in
// any goroutine, like the Reader's.
type Inspector struct {
	*Engine
}

// Inspect returns the engine's Inspector: the same engine, with the
// methods that the daemon's faces read besides the Reader. It allocates
// nothing.
func (e *Engine) Inspect() *Inspector { return &e.inspector }
