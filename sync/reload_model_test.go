package sync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iidp/metasync/schema"
)

// reloadWorld is the fixed material of TestReloadModelConcurrentReaders:
// configs over a pool of resources, indexes and chains, and the objects
// of each resource.
type reloadWorld struct {
	configs []*schema.Config
	objects map[string]map[string][]byte // resource -> object name -> JSON
	tokens  []string                     // every key an index may have
	indexes []string                     // the pool of index names
	chains  []string                     // the pool of chain names
	// What each config shows, for the readers: per chain, the last index
	// it has in some config; and the signatures of Indexes(), Chains() and
	// Status() of each config.
	lastOf                            map[string]map[string]bool
	indexSigs, chainSigs, resourceSig map[string]bool
}

func newReloadWorld(rng *rand.Rand) *reloadWorld {
	w := &reloadWorld{
		objects: map[string]map[string][]byte{}, lastOf: map[string]map[string]bool{},
		indexSigs: map[string]bool{}, chainSigs: map[string]bool{}, resourceSig: map[string]bool{},
	}
	resources := []string{"r0", "r1", "r2", "r3", "r4"}
	for i := range 8 {
		w.indexes = append(w.indexes, fmt.Sprintf("i%d", i))
	}
	for i := range 4 {
		w.chains = append(w.chains, fmt.Sprintf("c%d", i))
	}
	// An index's values are "index:name" or "index:tag"; its keys come
	// from refs or alt, drawn from these and from a few plain keys.
	objectNames := []string{"o0", "o1", "o2", "o3"}
	tags := []string{"t0", "t1", "t2"}
	w.tokens = []string{"k0", "k1", "k2", "k3"}
	for _, ix := range w.indexes {
		for _, s := range append(slices.Clone(objectNames), tags...) {
			w.tokens = append(w.tokens, ix+":"+s)
		}
	}
	pick := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = w.tokens[rng.IntN(len(w.tokens))]
		}
		return out
	}
	for _, r := range resources {
		w.objects[r] = map[string][]byte{}
		for _, name := range objectNames {
			w.objects[r][name] = w.object(rng, name, pick)
		}
	}
	for range 8 {
		cfg := &schema.Config{}
		rs := slices.Clone(resources)
		rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
		rs = rs[:3+rng.IntN(2)]
		names := slices.Clone(w.indexes)
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		var all []string
		for _, r := range rs {
			res := schema.Resource{Name: r, Version: "v1", Resource: r + "s"}
			if rng.IntN(4) == 0 {
				res.LabelSelector = "tier=a"
			}
			if rng.IntN(3) == 0 {
				res.Fields = map[string]string{"tag": "spec.tag", "name": "metadata.name"}
			}
			for range 1 + rng.IntN(2) {
				ix := schema.Index{Name: names[0], Key: "spec.refs", Value: names[0] + ":${metadata.name}"}
				names = names[1:]
				if rng.IntN(2) == 0 {
					ix.Key = "spec.alt"
				}
				if rng.IntN(2) == 0 {
					ix.Value = ix.Name + ":${spec.tag}"
				}
				res.Indexes = append(res.Indexes, ix)
				all = append(all, ix.Name)
			}
			cfg.Resources = append(cfg.Resources, res)
		}
		for _, c := range w.chains {
			if rng.IntN(3) == 0 {
				continue
			}
			steps := slices.Clone(all)
			rng.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
			cfg.Chains = append(cfg.Chains, schema.Chain{Name: c, Indexes: steps[:2+rng.IntN(2)]})
		}
		w.add(cfg)
	}
	return w
}

// object makes the JSON of one object.
func (w *reloadWorld) object(rng *rand.Rand, name string, pick func(int) []string) []byte {
	tier := "a"
	if rng.IntN(2) == 0 {
		tier = "b"
	}
	b, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"name": name, "labels": map[string]string{"tier": tier}},
		"spec":     map[string]any{"refs": pick(6), "alt": pick(6), "tag": fmt.Sprintf("t%d", rng.IntN(3))},
	})
	return b
}

// add records a config and what it shows.
func (w *reloadWorld) add(cfg *schema.Config) {
	w.configs = append(w.configs, cfg)
	var ixSig, chSig, resSig []string
	for _, r := range cfg.Resources {
		resSig = append(resSig, r.Name)
		for _, ix := range r.Indexes {
			ixSig = append(ixSig, ix.Name+"@"+r.Name)
		}
	}
	for _, c := range cfg.Chains {
		chSig = append(chSig, c.Name+"="+strings.Join(c.Indexes, ">"))
		if w.lastOf[c.Name] == nil {
			w.lastOf[c.Name] = map[string]bool{}
		}
		w.lastOf[c.Name][c.Indexes[len(c.Indexes)-1]] = true
	}
	slices.Sort(ixSig)
	slices.Sort(chSig)
	w.indexSigs[strings.Join(ixSig, " ")] = true
	w.chainSigs[strings.Join(chSig, " ")] = true
	w.resourceSig[strings.Join(resSig, " ")] = true
}

// objectsOf returns the objects of a resource, in name order.
func (w *reloadWorld) objectsOf(resource string) [][]byte {
	var out [][]byte
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range w.objects[resource] {
			if !yield(k) {
				return
			}
		}
	}) {
		out = append(out, w.objects[resource][name])
	}
	return out
}

// observe describes everything a reader can see of e.
func observe(e *Engine) string {
	var b strings.Builder
	for _, st := range e.Status() {
		fmt.Fprintf(&b, "resource %s objects=%d synced=%v syncing=%v ready=%v\n", st.Name, st.Objects, st.Synced, st.Syncing, st.Ready)
		if fields, err := e.ResourceFields(st.Name); err == nil {
			for _, f := range fields {
				fmt.Fprintf(&b, "  fields %s %s\n", f.Key, f.JSON)
			}
		}
	}
	for _, ix := range e.Indexes() {
		fmt.Fprintf(&b, "index %+v\n", ix)
		for _, k := range e.Keys(ix.Name) {
			fmt.Fprintf(&b, "  %s = %v\n", k, e.Lookup(ix.Name, k))
			if fields, err := e.IndexFields(ix.Name, k); err == nil {
				fmt.Fprintf(&b, "    objects %v\n", fields)
			}
		}
	}
	for _, ch := range e.Chains() {
		fmt.Fprintf(&b, "chain %+v\n", ch)
		for _, k := range e.Keys(ch.Indexes[0]) {
			fmt.Fprintf(&b, "  %s -> %v\n", k, e.Resolve(ch.Name, k))
		}
	}
	return b.String()
}

// firstDiff returns the first line where a and b differ.
func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(la), len(lb)) {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n  reloaded: %s\n  fresh:    %s", i+1, x, y)
		}
	}
	return ""
}

// TestReloadModelConcurrentReaders reloads an engine ~100 times between
// random configs (resources, indexes moving between them, rules,
// selectors, fields and chains changing), with writes in between, and
// proves that:
//   - after each reload and the first lists of what it started or
//     restarted, the engine shows exactly what a fresh engine of the same
//     config fed the same objects shows: nothing lost, no ghosts;
//   - meanwhile, readers on other goroutines only ever see one config at
//     a time: a view whose chains' steps are the live indexes of its
//     snapshot, Indexes(), Chains() and Status() of one config, and index
//     and chain answers that some config could give. Run it with -race.
func TestReloadModelConcurrentReaders(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	world := newReloadWorld(rng)
	e := testEngine(t, world.configs[0])
	feed := func(e *Engine, all bool) {
		v, _ := e.view()
		for _, w := range v.watchers {
			if all || !w.Listed1() {
				list(t, e, w.Plan.Name, world.objectsOf(w.Plan.Name)...)
			}
		}
	}
	feed(e, true)

	var failures atomic.Int64
	fail := func(format string, args ...any) {
		if failures.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	stop := make(chan struct{})
	var readers gosync.WaitGroup
	var reads atomic.Int64
	for r := range 4 {
		readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 99))
			for {
				select {
				case <-stop:
					return
				default:
				}
				reads.Add(1)
				checkView(e, fail)
				checkOneConfig(e, world, fail)
				checkAnswers(e, world, rng, fail)
				_ = e.Ready()
				_ = e.Inspect().Synced()
			}
		})
	}

	// A subscriber too: key and chain subscriptions that reloads rebind or
	// end, whose answers are always some config's.
	var events atomic.Int64
	readers.Go(func() { subscribeThroughReloads(e, world, stop, fail, &events) })

	start := time.Now()
	reloads := 0
	for i := range 100 {
		cfg := world.configs[rng.IntN(len(world.configs))]
		plan, err := schema.Compile(cfg)
		must(t, err)
		if _, err := e.Reload(plan); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		reloads++
		feed(e, false)
		// A write now and then: an object of a live resource changes.
		if rng.IntN(3) == 0 {
			writeOne(t, e, world, rng, cfg)
		}

		fresh := testEngine(t, cfg)
		feed(fresh, true)
		if got, want := observe(e), observe(fresh); got != want {
			t.Fatalf("after reload %d (config %d), the engine differs from a fresh one at %s", i, slices.Index(world.configs, cfg), firstDiff(got, want))
		}
		if failures.Load() > 0 {
			break
		}
	}
	close(stop)
	readers.Wait()
	if n := e.Inspect().Subscriptions().Open; n != 0 {
		t.Errorf("%d subscriptions open after the subscriber closed its own", n)
	}
	t.Logf("%d reloads in %v, %d reader rounds, %d subscription events", reloads, time.Since(start).Round(time.Millisecond), reads.Load(), events.Load())
}

// checkView: one view of e, its chains over live indexes of its snapshot.
func checkView(e *Engine, fail func(string, ...any)) {
	v, snap := e.view()
	if len(v.chains) != len(v.plan.Chains) {
		fail("a view with %d chains published for a plan of %d", len(v.chains), len(v.plan.Chains))
	}
	for name, ch := range v.chains {
		if len(ch.steps) != len(ch.indexes) {
			fail("chain %s: %d steps for %d indexes", name, len(ch.steps), len(ch.indexes))
			continue
		}
		for i, ixName := range ch.indexes {
			ix, ok := snap.Index(ixName)
			if !ok || ix != ch.steps[i] {
				fail("chain %s step %d: %s is not a live index of the view's snapshot (found %v)", name, i, ixName, ok)
			}
		}
	}
	for name := range v.byIndex {
		if _, ok := snap.Index(name); !ok {
			fail("index %s of the view is not in its snapshot", name)
		}
	}
	for _, w := range v.watchers {
		if w.Src == nil {
			fail("watcher %s of a published view has no source", w.Plan.Name)
		}
	}
}

// checkOneConfig: each of Indexes(), Chains() and Status() sees one config
// of the world.
func checkOneConfig(e *Engine, world *reloadWorld, fail func(string, ...any)) {
	var sig []string
	for _, ix := range e.Indexes() {
		sig = append(sig, ix.Name+"@"+ix.Resource)
	}
	if s := strings.Join(sig, " "); !world.indexSigs[s] {
		fail("Indexes() = %s: no config's", s)
	}
	sig = sig[:0]
	for _, ch := range e.Chains() {
		sig = append(sig, ch.Name+"="+strings.Join(ch.Indexes, ">"))
	}
	if s := strings.Join(sig, " "); !world.chainSigs[s] {
		fail("Chains() = %q: no config's", s)
	}
	sig = sig[:0]
	for _, st := range e.Status() {
		sig = append(sig, st.Name)
	}
	if s := strings.Join(sig, " "); !world.resourceSig[s] {
		fail("Status() of %q: no config's", s)
	}
}

// checkAnswers: lookups, keys and resolves of random indexes, chains and
// keys give answers some config could give.
func checkAnswers(e *Engine, world *reloadWorld, rng *rand.Rand, fail func(string, ...any)) {
	for range 8 {
		ix := world.indexes[rng.IntN(len(world.indexes))]
		key := world.tokens[rng.IntN(len(world.tokens))]
		for _, val := range e.Lookup(ix, key) {
			if !strings.HasPrefix(val, ix+":") {
				fail("Lookup(%s, %s) has %q, a value of another index", ix, key, val)
			}
		}
		for _, k := range e.Keys(ix) {
			if !slices.Contains(world.tokens, k) {
				fail("Keys(%s) has %q", ix, k)
			}
		}
		_ = e.Inspect().HasIndex(ix)
		_ = e.Inspect().IndexSynced(ix)
		c := world.chains[rng.IntN(len(world.chains))]
		for _, val := range e.Resolve(c, key) {
			last, _, _ := strings.Cut(val, ":")
			if !world.lastOf[c][last] {
				fail("Resolve(%s, %s) has %q: %s is the last index of %s in no config", c, key, val, last, c)
			}
		}
		_ = e.Inspect().HasChain(c)
		_ = e.Inspect().ChainSynced(c)
	}
}

// subscribeThroughReloads holds one key or chain subscription at a time
// until stop, taking a new one now and then or when a reload ends it, and
// checks that every answer it hears is some config's; it counts the
// events in events.
func subscribeThroughReloads(e *Engine, world *reloadWorld, stop <-chan struct{}, fail func(string, ...any), events *atomic.Int64) {
	rng := rand.New(rand.NewPCG(5, 99))
	var sub *Subscription
	var target Target
	defer func() {
		if sub != nil {
			sub.Close()
		}
	}()
	for {
		select {
		case <-stop:
			return
		default:
		}
		if sub == nil {
			key := world.tokens[rng.IntN(len(world.tokens))]
			target = KeyOf(world.indexes[rng.IntN(len(world.indexes))], key)
			if rng.IntN(2) == 0 {
				target = ChainOf(world.chains[rng.IntN(len(world.chains))], key)
			}
			s, err := e.Subscribe(context.Background(), target)
			if err != nil {
				continue // not in the current config
			}
			sub = s
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		ev, err := sub.Next(ctx)
		cancel()
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			if rng.IntN(4) == 0 { // and take a new one
				sub.Close()
				sub = nil
			}
			continue
		case err != nil:
			fail("subscription %+v: %v", target, err)
			sub.Close()
			sub = nil
			continue
		case ev.Type == EventGone:
			if _, err := sub.Next(context.Background()); !errors.Is(err, ErrClosed) {
				fail("subscription %+v: after EventGone: %v, want ErrClosed", target, err)
			}
			sub = nil
			continue
		}
		events.Add(1)
		for _, val := range ev.Values {
			last, _, _ := strings.Cut(val, ":")
			if target.Chain != "" && !world.lastOf[target.Chain][last] || target.Index != "" && last != target.Index {
				fail("subscription %+v: %v %v: no config's answer", target, ev.Type, ev.Values)
			}
		}
	}
}

// writeOne changes an object of a live resource of cfg, in the world and
// in e, as a watch event would.
func writeOne(t *testing.T, e *Engine, world *reloadWorld, rng *rand.Rand, cfg *schema.Config) {
	r := cfg.Resources[rng.IntN(len(cfg.Resources))].Name
	name := fmt.Sprintf("o%d", rng.IntN(4))
	obj := world.object(rng, name, func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = world.tokens[rng.IntN(len(world.tokens))]
		}
		return out
	})
	world.objects[r][name] = obj
	v, _ := e.view()
	w := v.byName[r].lead()
	must(t, w.Update(w.Project(string(obj))))
}
