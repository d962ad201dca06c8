package indexer

import (
	"iter"
	"maps"
)

// choiceShards is the number of maps that a unique index's chosen answers
// are split in, by the key's hash.
const choiceShards = 64

// choices maps each key in conflict of a unique index to what it answers
// (see indexSnap.chosen). A published one is never modified: a commit
// that changes some keys copies the shards that hold them, so that with
// many keys in conflict a write copies a 64th of them, not all. The nil
// *choices holds no key.
type choices struct {
	shard [choiceShards]map[string]choice
	n     int
}

func choiceShard(hs hashSeed, key string) int { return int(hashKey(hs, key) >> 58) }

// get returns what key answers, if it is in conflict.
func (c *choices) get(hs hashSeed, key string) (choice, bool) {
	if c == nil {
		return choice{}, false
	}
	ch, ok := c.shard[choiceShard(hs, key)][key]
	return ch, ok
}

// has reports whether key is in conflict.
func (c *choices) has(hs hashSeed, key string) bool {
	_, ok := c.get(hs, key)
	return ok
}

// count returns the number of keys in conflict.
func (c *choices) count() int {
	if c == nil {
		return 0
	}
	return c.n
}

// all yields every key in conflict and what it answers, in no order.
func (c *choices) all() iter.Seq2[string, choice] {
	return func(yield func(string, choice) bool) {
		if c == nil {
			return
		}
		for _, m := range c.shard {
			for k, ch := range m {
				if !yield(k, ch) {
					return
				}
			}
		}
	}
}

// keys returns the keys in conflict, in no order.
func (c *choices) keys() []string {
	keys := make([]string, 0, c.count())
	for k := range c.all() {
		keys = append(keys, k)
	}
	return keys
}

// choicesWriter changes a copy of a published *choices: the first change
// copies the shard array, the first change of each shard copies the shard.
type choicesWriter struct {
	hs     hashSeed
	was    *choices
	out    *choices
	copied [choiceShards]bool
}

func (w *choicesWriter) shardFor(key string) map[string]choice {
	if w.out == nil {
		w.out = &choices{}
		if w.was != nil {
			*w.out = *w.was
		}
	}
	sh := choiceShard(w.hs, key)
	if !w.copied[sh] {
		w.out.shard[sh] = maps.Clone(w.out.shard[sh])
		if w.out.shard[sh] == nil {
			w.out.shard[sh] = map[string]choice{}
		}
		w.copied[sh] = true
	}
	return w.out.shard[sh]
}

// set makes key answer c.
func (w *choicesWriter) set(key string, c choice) {
	m := w.shardFor(key)
	if _, ok := m[key]; !ok {
		w.out.n++
	}
	m[key] = c
}

// remove takes key out of conflict.
func (w *choicesWriter) remove(key string) {
	if !w.current().has(w.hs, key) {
		return
	}
	m := w.shardFor(key)
	delete(m, key)
	w.out.n--
}

// current is the choices as changed so far.
func (w *choicesWriter) current() *choices {
	if w.out != nil {
		return w.out
	}
	return w.was
}

// result is the changed choices: was when nothing changed, nil when no key
// is in conflict.
func (w *choicesWriter) result() *choices {
	if w.out == nil {
		return w.was
	}
	if w.out.n == 0 {
		return nil
	}
	for sh, m := range w.out.shard {
		if w.copied[sh] && len(m) == 0 {
			w.out.shard[sh] = nil
		}
	}
	return w.out
}
