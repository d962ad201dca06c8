// Fan-out: many engines (or plain informers) in one process, each with its
// own watch connection, and how long a write takes to reach all of them.

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// follower is one watcher of the fan-out: an engine or a plain informer.
type follower struct {
	sees func(model string) bool
	stop func()
}

// ownConfig returns cfg with a dialer of its own: a client built from it
// gets its own transport and TCP connection, as a pod would, instead of
// one more HTTP/2 stream on a connection that all followers share.
func ownConfig(cfg *rest.Config) *rest.Config {
	own := rest.CopyConfig(cfg)
	own.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return own
}

// engineFollower starts a metasync engine on a connection of its own and
// waits for its sync.
func engineFollower(ctx context.Context, cfg *rest.Config) (follower, error) {
	e, stop, err := startEngine(ownConfig(cfg))
	if err != nil {
		return follower{}, err
	}
	if err := e.WaitForSync(ctx); err != nil {
		stop()
		return follower{}, err
	}
	ix, _ := e.Inspect().Index("model-to-app")
	return follower{sees: func(m string) bool { return len(ix.Lookup(m)) > 0 }, stop: stop}, nil
}

// informerFollower starts a plain informer on a connection of its own and
// waits for its sync.
func informerFollower(ctx context.Context, cfg *rest.Config) (follower, error) {
	dyn, err := dynamic.NewForConfig(ownConfig(cfg))
	if err != nil {
		return follower{}, err
	}
	factory, inf, err := seedInformer(dyn)
	if err != nil {
		return follower{}, err
	}
	stopCh := make(chan struct{})
	stop := func() { close(stopCh); factory.Shutdown() }
	factory.Start(stopCh)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		stop()
		return follower{}, fmt.Errorf("informer did not sync")
	}
	idx := inf.GetIndexer()
	return follower{sees: func(m string) bool {
		objs, _ := idx.ByIndex("model", m)
		return len(objs) > 0
	}, stop: stop}, nil
}

// measureFanout starts *fanout followers in this process, each with its
// own watch connection, and times writes until all of them see each one.
func measureFanout(ctx context.Context, dyn dynamic.Interface, cfg *rest.Config, what string, start func(context.Context, *rest.Config) (follower, error)) (all, first percentiles, err error) {
	logf("fan-out: starting %d %s", *fanout, what)
	var fs []follower
	defer func() {
		for _, f := range fs {
			f.stop()
		}
		runtime.GC()
	}()
	for range *fanout {
		f, err := start(ctx, cfg)
		if err != nil {
			return all, first, err
		}
		fs = append(fs, f)
	}
	logf("fan-out: all %d %s synced; writing", len(fs), what)
	if *cpuProfile != "" && what == "engines" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return all, first, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return all, first, err
		}
		defer pprof.StopCPUProfile()
	}
	if *apiProfile != "" && what == "engines" {
		done := make(chan struct{})
		defer func() { <-done }()
		go func() {
			defer close(done)
			kube := kubernetes.NewForConfigOrDie(cfg)
			body, err := kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "3").DoRaw(ctx)
			if err == nil {
				err = os.WriteFile(*apiProfile, body, 0o644)
			}
			if err != nil {
				logf("fan-out: apiserver profile: %v", err)
			}
		}()
	}
	// The first follower that sees a write tells the write's own latency
	// apart from the time it takes to reach all of them.
	lat, err := latency(ctx, dyn, "fanout-"+what, *fanoutWrites, func(m string) bool {
		for _, f := range fs {
			if !f.sees(m) {
				return false
			}
		}
		return true
	}, func(m string) bool {
		for _, f := range fs {
			if f.sees(m) {
				return true
			}
		}
		return false
	})
	if err != nil {
		return all, first, err
	}
	logf("fan-out: the first of %d %s sees a write at p50 %.2f ms, p99 %.2f ms; all of them at p50 %.2f ms, p99 %.2f ms",
		len(fs), what, lat[1].p50, lat[1].p99, lat[0].p50, lat[0].p99)
	return lat[0], lat[1], nil
}
