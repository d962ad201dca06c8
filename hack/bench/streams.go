// Change streams: a library subscription and an HTTP stream of `metasync
// serve` on the key that each latency write adds, timed from the same
// writes as write -> visible; and what 1,000 open subscriptions and idle
// HTTP streams cost.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	gosync "sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/wire"
	msync "github.com/iidp/metasync/sync"
)

// streamServer is `metasync serve` (-metasync) over the bench's
// AppModels, its stream limits raised for the open streams' rows.
type streamServer struct {
	addr string // host:port
	p    *serveProcess
	dir  string
	once gosync.Once
}

// startStreams runs `metasync serve` on the bench's namespace.
func startStreams(cfg *rest.Config) (*streamServer, error) {
	if _, err := os.Stat(*metasyncBin); err != nil {
		return nil, fmt.Errorf("-metasync %s: %w (make bench builds it)", *metasyncBin, err)
	}
	dir, kubeconfig, err := workDir(cfg, "bench-streams-")
	if err != nil {
		return nil, err
	}
	p, err := startServe(kubeconfig, ns, dir, "--max-connections", "8192", "--max-streams", "4096", "--max-streams-per-caller", "1024")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &streamServer{addr: p.addr, p: p, dir: dir}, nil
}

// stop ends the daemon; a second call does nothing.
func (s *streamServer) stop() {
	s.once.Do(func() {
		s.p.stop()
		os.RemoveAll(s.dir)
	})
}

// keyURL is the stream URL of an index key.
func (s *streamServer) keyURL(key string) string {
	return "http://" + s.addr + "/v1/indexes/model-to-app/keys/" + url.PathEscape(key) + "?watch=true"
}

// notified is the state of a subscriber probe for the write in flight:
// when its subscriber was told of the new value, and how to end it.
type notified struct {
	at     atomic.Pointer[time.Time]
	cancel context.CancelFunc
	ended  chan struct{}
}

// probe returns the probe of n, whose prepare is subscribe.
func (n *notified) probe(subscribe func(model string) error) probe {
	return probe{
		prepare: func(m string) error {
			n.at.Store(nil)
			return subscribe(m)
		},
		seen: func(string) (time.Time, bool) {
			if at := n.at.Load(); at != nil {
				return *at, true
			}
			return time.Time{}, false
		},
		done: func(string) {
			n.cancel()
			<-n.ended
		},
	}
}

// libraryProbe subscribes, before each write, to the key of the model
// about to be written (sync.KeyOf) and takes its snapshot (no values); a
// goroutine then waits in Next and notes the time the update with the new
// value returns.
func libraryProbe(e *msync.Engine) probe {
	n := &notified{}
	return n.probe(func(m string) error {
		ctx, cancel := context.WithCancel(context.Background())
		sub, err := e.Subscribe(ctx, msync.KeyOf("model-to-app", m))
		if err != nil {
			cancel()
			return err
		}
		first, err := sub.Next(ctx)
		if err != nil || first.Type != msync.EventSnapshot || len(first.Values) != 0 {
			cancel()
			return fmt.Errorf("library subscription of %s: first event %+v, %v", m, first, err)
		}
		n.cancel, n.ended = cancel, make(chan struct{})
		go func() {
			defer close(n.ended)
			defer sub.Close()
			for {
				ev, err := sub.Next(ctx)
				now := time.Now()
				if err != nil {
					return
				}
				if ev.Type == msync.EventUpdate && len(ev.Values) > 0 {
					n.at.Store(&now)
					return
				}
			}
		}()
		return nil
	})
}

// httpProbe opens, before each write, an HTTP stream of the key of the
// model about to be written (GET ...?watch=true, its own connection) and
// reads its snapshot frame (no values); a goroutine then reads the next
// frames and notes the time the line of the update with the new value
// arrives.
func httpProbe(s *streamServer) probe {
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	n := &notified{}
	return n.probe(func(m string) error {
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.keyURL(m), nil)
		if err != nil {
			cancel()
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			cancel()
			return err
		}
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadBytes('\n')
		var first wire.Frame
		if err == nil {
			err = json.Unmarshal(line, &first)
		}
		if err != nil || resp.StatusCode != http.StatusOK || first.Type != wire.FrameSnapshot || first.Values != nil && len(*first.Values) != 0 {
			cancel()
			resp.Body.Close()
			return fmt.Errorf("HTTP stream of %s: %d, first frame %q: %v", m, resp.StatusCode, line, err)
		}
		n.cancel, n.ended = cancel, make(chan struct{})
		go func() {
			defer close(n.ended)
			defer resp.Body.Close()
			for {
				line, err := br.ReadBytes('\n')
				now := time.Now()
				if err != nil {
					return
				}
				var f wire.Frame
				if json.Unmarshal(line, &f) == nil && f.Type == wire.FrameUpdate && f.Values != nil && len(*f.Values) > 0 {
					n.at.Store(&now)
					return
				}
			}
		}()
		return nil
	})
}

// openCost is what one open subscription or stream costs: heap is the
// live heap in this process (a subscription), the resident memory of the
// daemon (a stream).
type openCost struct {
	heap, stacks, goroutines float64
}

// usage is the live heap (heap: after two GCs), the goroutine stacks in
// use and the goroutines.
func usage() (h, stacks uint64, goroutines int) {
	h = heap()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return h, m.StackInuse, runtime.NumGoroutine()
}

// costOf is the cost of one of count things opened between two usages.
func costOf(h0, s0 uint64, g0 int, count int) openCost {
	h1, s1, g1 := usage()
	return openCost{
		heap:       (float64(h1) - float64(h0)) / float64(count),
		stacks:     (float64(s1) - float64(s0)) / float64(count),
		goroutines: float64(g1-g0) / float64(count),
	}
}

// openIdleStream opens an HTTP stream of key on a bare TCP connection and
// reads its response head and snapshot frame; the client then holds the
// connection and reads nothing.
func openIdleStream(s *streamServer, key string) (net.Conn, error) {
	conn, err := net.Dial("tcp", s.addr)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(conn, "GET /v1/indexes/model-to-app/keys/%s?watch=true HTTP/1.1\r\nHost: bench\r\n\r\n", url.PathEscape(key))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		var line []byte
		line, err = bufio.NewReader(resp.Body).ReadBytes('\n')
		var f wire.Frame
		if err == nil && (json.Unmarshal(line, &f) != nil || f.Type != wire.FrameSnapshot) {
			err = fmt.Errorf("first frame %q", line)
		}
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("idle stream of %s: %w", key, err)
	}
	return conn, nil
}

// daemonCost is what the daemon says it holds, in its /metrics and
// /proc: resident memory, goroutine stacks and goroutines.
func daemonCost(s *streamServer) (rss, stacks float64, goroutines int, err error) {
	m, err := procMemory(s.p.cmd.Process.Pid)
	if err != nil {
		return 0, 0, 0, err
	}
	g, err := gauges(s.addr, "go_memstats_stack_inuse_bytes", "go_goroutines")
	if err != nil {
		return 0, 0, 0, err
	}
	return m.rss, g[0], int(g[1]), nil
}

// measureOpenStreams opens count key subscriptions of the library (each
// with its snapshot taken) in this process, then count idle HTTP streams
// of the daemon (clients that read the snapshot and nothing more, each a
// bare TCP connection), on the first count keys, and returns the cost of
// one of each: for a subscription the live heap, goroutine stacks and
// goroutines of this process; for a stream the daemon's resident memory
// (VmRSS, in heap), stacks and goroutines, before and after.
func measureOpenStreams(ctx context.Context, e *msync.Engine, s *streamServer, keys []string, count int) (lib, stream openCost, err error) {
	logf("streams: %d library subscriptions, then %d idle HTTP streams", count, count)
	h0, s0, g0 := usage()
	subs := make([]*msync.Subscription, 0, count)
	for _, k := range keys[:count] {
		sub, err := e.Subscribe(ctx, msync.KeyOf("model-to-app", k))
		if err != nil {
			return lib, stream, err
		}
		subs = append(subs, sub)
		if ev, err := sub.Next(ctx); err != nil || ev.Type != msync.EventSnapshot {
			return lib, stream, fmt.Errorf("subscription of %s: first event %+v, %v", k, ev, err)
		}
	}
	lib = costOf(h0, s0, g0, count)
	for _, sub := range subs {
		sub.Close()
	}
	subs = nil

	r0, st0, gr0, err := daemonCost(s)
	if err != nil {
		return lib, stream, err
	}
	conns := make([]net.Conn, 0, count)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, k := range keys[:count] {
		c, err := openIdleStream(s, k)
		if err != nil {
			return lib, stream, err
		}
		conns = append(conns, c)
	}
	time.Sleep(time.Second) // the daemon's handlers settle
	r1, st1, gr1, err := daemonCost(s)
	if err != nil {
		return lib, stream, err
	}
	stream = openCost{heap: (r1 - r0) / float64(count), stacks: (st1 - st0) / float64(count), goroutines: float64(gr1-gr0) / float64(count)}
	logf("streams: per library subscription %.0f B heap, %.2f goroutines; per idle HTTP stream of the daemon %.0f B resident, %.0f B stacks, %.2f goroutines",
		lib.heap, lib.goroutines, stream.heap, stream.stacks, stream.goroutines)
	return lib, stream, nil
}
