// One resource's writes while another is busy: write → visible of a
// resource b, paced, while the AppModels are idle, written by a claimant
// that moves between keys, explained at the daemon's whole budget, or
// relisted; and, as a control, while another engine relists.

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"time"

	"golang.org/x/time/rate"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

var isolationWrites = flag.Int("isolation-writes", 15000, "writes of resource b per load in the isolation rows, one a millisecond (0: skip the rows)")

// isolationLoads are the loads of the AppModels under which b's writes
// are timed, in the order the rows print them.
var isolationLoads = []string{"idle", "claimant", "explain", "relist", "relist-watched", "relist-apart"}

// isolationWatchers is the number of subscriptions to the whole
// model-to-app index, synced and then never read again (clients of
// ?watch=true that stopped reading), under the relist-watched load.
const isolationWatchers = 16

// runIsolationOnly prints the isolation rows alone (-only isolation): they
// need no control plane.
func runIsolationOnly() error {
	rows, err := isolationRows()
	if err != nil {
		return err
	}
	printTable(isolationTitle(), "idle", "busy", rows)
	return nil
}

func isolationTitle() string {
	return fmt.Sprintf("one resource's writes while another is busy — %d AppModels, in process, %d CPUs", *n, runtime.NumCPU())
}

// isolationPlan is the bench's plan with a second resource, ConfigMaps in
// ns, indexed by name to data.v: the resource b whose writes are timed.
func isolationPlan() (*mschema.Plan, error) {
	return mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Namespace: ns, LabelSelector: "iidp=iidp",
		Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name", Unique: *unique}},
	}, {
		Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
		Indexes: []mschema.Index{{Name: "b", Key: "metadata.name", Value: "data.v"}},
	}}})
}

// isolationRows times b's writes under each load, each in an engine of
// its own fed through sync.NewOffline (the projection, rules and indexes
// of a watch event, without an apiserver: what is timed is the engine's
// own path). A write is timed from when it was due, one a millisecond,
// until a lookup answers it; a write that waits counts the writes due
// meanwhile as waiting too.
func isolationRows() ([]row, error) {
	if *isolationWrites <= 0 {
		return nil, nil
	}
	lists, err := appModelLists()
	if err != nil {
		return nil, err
	}
	p99 := map[string]float64{}
	p50 := map[string]float64{}
	for _, load := range isolationLoads {
		lat, works, err := isolationRun(load, lists)
		if err != nil {
			return nil, fmt.Errorf("isolation, %s: %w", load, err)
		}
		slices.Sort(lat)
		at := func(q float64) float64 {
			return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / 1e3
		}
		p50[load], p99[load] = at(0.50), at(0.99)
		logf("isolation: AppModels %s (%d times): b's write → visible p50 %.1f µs, p99 %.1f µs, max %.1f µs", load, works, p50[load], p99[load], float64(lat[len(lat)-1])/1e3)
	}
	idle := p99["idle"]
	name := map[string]string{
		"claimant":       "a claimant moving between keys, 50/s",
		"explain":        "explained at the daemon's budget, 10/s (burst 20)",
		"relist":         fmt.Sprintf("relisted, %d objects, in a loop", *n),
		"relist-watched": fmt.Sprintf("relisted in a loop, %d index streams that stopped reading", isolationWatchers),
		"relist-apart":   "control: another engine relists in a loop",
	}
	rows := []row{{name: "b's write → visible p50, AppModels idle", unit: "µs", baseline: p50["idle"], metasync: p50["idle"], raw: true}}
	for _, load := range isolationLoads[1:] {
		r := row{name: "b's write → visible p99, AppModels " + name[load], unit: "µs", baseline: idle, metasync: p99[load],
			left: "idle", right: "busy"}
		if load != "relist-apart" {
			r.target = ratioAtMost(1.5, "≤ 1.5 × idle")
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// appModelLists are two lists of the N AppModels as JSON, the second with
// every object changed (its version and models), for relists that change
// every object and every key of the index (600,000 keys at 100,000
// objects: the models of the one list go, the other's come).
func appModelLists() ([2][][]byte, error) {
	var lists [2][][]byte
	for v := range 2 {
		lists[v] = make([][]byte, *n)
		for i := range *n {
			u := appModel(i)
			u.SetNamespace(ns)
			u.SetResourceVersion(strconv.Itoa(1 + v))
			if v == 1 {
				spec := u.Object["spec"].(map[string]any)
				spec["version"] = "1.8"
				spec["models"] = []any{model(i, 0) + "b", model(i, 1) + "b", model(i, 2) + "b"}
			}
			b, err := json.Marshal(u.Object)
			if err != nil {
				return lists, err
			}
			lists[v][i] = b
		}
	}
	return lists, nil
}

// isolationRun times b's writes while load runs on the AppModels, and
// counts the load's work done meanwhile (relists, writes, explanations).
func isolationRun(load string, lists [2][][]byte) (lat []time.Duration, works int, err error) {
	p, err := isolationPlan()
	if err != nil {
		return nil, 0, err
	}
	discard := slog.New(slog.DiscardHandler)
	e, f, err := msync.NewOffline(p, discard)
	if err != nil {
		return nil, 0, err
	}
	if err := f.Replace("appmodels", lists[0]...); err != nil {
		return nil, 0, err
	}
	var work func(i int) error
	switch load {
	case "claimant":
		// One AppModel whose model is each time another app's: its key
		// gains a second claimant at each write.
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		work = func(i int) error {
			<-tick.C
			u := appModel(0)
			u.SetName("mover")
			u.SetNamespace(ns)
			u.SetResourceVersion(strconv.Itoa(10 + i))
			u.Object["spec"].(map[string]any)["models"] = []any{model((i*7919)%*n, i%3)}
			b, err := json.Marshal(u.Object)
			if err != nil {
				return err
			}
			return f.Apply("appmodels", b)
		}
	case "explain":
		lim := rate.NewLimiter(10, 20)
		keys := benchKeys()
		work = func(i int) error {
			r := lim.Reserve()
			time.Sleep(r.Delay())
			e.Explain(msync.Target{Index: "model-to-app", Key: keys[i%len(keys)]})
			return nil
		}
	case "relist", "relist-watched":
		if load == "relist-watched" {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for range isolationWatchers {
				sub, err := e.Subscribe(ctx, msync.IndexOf("model-to-app"))
				if err != nil {
					return nil, 0, err
				}
				for {
					ev, err := sub.Next(ctx)
					if err != nil {
						return nil, 0, err
					}
					if ev.Type == msync.EventSynced {
						break
					}
				}
			}
		}
		work = func(i int) error { return f.Replace("appmodels", lists[(i+1)%2]...) }
	case "relist-apart":
		_, other, err := msync.NewOffline(p, discard)
		if err != nil {
			return nil, 0, err
		}
		if err := other.Replace("appmodels", lists[0]...); err != nil {
			return nil, 0, err
		}
		work = func(i int) error { return other.Replace("appmodels", lists[(i+1)%2]...) }
	}
	runtime.GC() // the setup's garbage
	stop, done := make(chan struct{}), make(chan error, 1)
	go func() {
		for ; work != nil; works++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := work(works); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	if load != "idle" {
		time.Sleep(200 * time.Millisecond) // the load under way
	}
	lat = make([]time.Duration, 0, *isolationWrites)
	const every = time.Millisecond
	base := time.Now()
	for i := range *isolationWrites {
		from := base.Add(time.Duration(i) * every)
		if wait := time.Until(from); wait > 0 {
			time.Sleep(wait)
			// The timer's slack is no write's: the writes due after
			// this one move by as much.
			now := time.Now()
			base = base.Add(now.Sub(from))
			from = now
		}
		v := strconv.Itoa(i)
		b := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b","namespace":"` + ns + `","resourceVersion":"` + v + `"},"data":{"v":"` + v + `"}}`)
		if err := f.Apply("configmaps", b); err != nil {
			close(stop)
			<-done
			return nil, 0, err
		}
		for got := e.Lookup("b", "b"); len(got) != 1 || got[0] != v; got = e.Lookup("b", "b") {
		}
		lat = append(lat, time.Since(from))
	}
	close(stop)
	err = <-done
	return lat, works, err
}
