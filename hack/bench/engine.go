// metasync's side: the engine's plan, starting an engine, and measuring the
// initial sync and heap of the engine that the rest of the run uses.

package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// plan compiles the bench's metasync config: the AppModels in ns labelled
// iidp=iidp, indexed model-to-app from spec.models to metadata.name,
// unique as in the reference setup (-unique=false: not).
func plan() (*mschema.Plan, error) {
	return mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Namespace: ns, LabelSelector: "iidp=iidp",
		Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name", Unique: *unique}},
	}}})
}

var unique = flag.Bool("unique", true, "mark model-to-app unique, as the reference setup does")

// engineLogger is the engines' logger: their debug lines on stderr with -v,
// nothing otherwise.
func engineLogger() *slog.Logger {
	if *verbose {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return quiet
}

// startEngine starts an engine on cfg in the background, without waiting
// for its sync; the returned function cancels it and waits for it to end.
func startEngine(cfg *rest.Config) (*msync.Engine, func(), error) {
	return startEngineWith(cfg, msync.Options{})
}

// startEngineWith is startEngine with opts (its logger set here).
func startEngineWith(cfg *rest.Config, opts msync.Options) (*msync.Engine, func(), error) {
	p, err := plan()
	if err != nil {
		return nil, nil, err
	}
	opts.Logger = engineLogger()
	e, err := msync.New(p, cfg, opts)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Start(ctx); close(done) }()
	return e, func() { cancel(); <-done }, nil
}

// measureEngine starts the engine that the rest of the run uses and
// measures its initial sync and heap per object, then writes the
// -memprofile heap profile if asked. The caller stops the engine.
func measureEngine(ctx context.Context, cfg *rest.Config, keys []string) (result, *msync.Engine, func(), error) {
	var r result
	before := heap()
	logf("metasync: syncing")
	start := time.Now()
	e, stop, err := startEngine(cfg)
	if err != nil {
		return r, nil, nil, err
	}
	if err := e.WaitForSync(ctx); err != nil {
		return r, nil, nil, err
	}
	r.sync = time.Since(start)
	r.bytesPerObject = float64(heap()-before) / float64(*n)
	logf("metasync: synced in %s, %.0f B per object", r.sync, r.bytesPerObject)
	if *memProfile != "" {
		f, err := os.Create(*memProfile)
		if err != nil {
			return r, nil, nil, err
		}
		_ = pprof.WriteHeapProfile(f)
		f.Close()
	}
	return r, e, stop, nil
}
