package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/internal/wire"
	msync "github.com/iidp/metasync/sync"
)

// usage is the process's live heap, goroutine stacks and goroutines.
type usage struct {
	heap, stack uint64
	goroutines  int
}

// measureUsage collects garbage twice and reads the live heap, the stacks
// in use and the goroutines.
func measureUsage() usage {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return usage{heap: m.HeapAlloc, stack: m.StackInuse, goroutines: runtime.NumGoroutine()}
}

// per is the cost of one of n things opened between before and after.
type per struct {
	heap, stack, goroutines float64
}

func perOne(before, after usage, n int) per {
	return per{
		heap:       (float64(after.heap) - float64(before.heap)) / float64(n),
		stack:      (float64(after.stack) - float64(before.stack)) / float64(n),
		goroutines: float64(after.goroutines-before.goroutines) / float64(n),
	}
}

// settle waits until the goroutines stop changing in number: handlers and
// connections that were closed have ended.
func settle() {
	last := -1
	for range 100 {
		if n := runtime.NumGoroutine(); n == last {
			return
		} else {
			last = n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openStream opens a stream of key's answer on a bare TCP connection and
// reads its response head and first frame (the snapshot); the client then
// holds the connection and reads nothing.
func openStream(addr, key string) (net.Conn, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(conn, "GET /v1/indexes/model-to-app/keys/%s?watch=true HTTP/1.1\r\nHost: bench\r\n\r\n", key)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	line, err := bufio.NewReader(resp.Body).ReadBytes('\n')
	if err != nil {
		conn.Close()
		return nil, err
	}
	var f wire.Frame
	if err := json.Unmarshal(line, &f); err != nil || f.Type != "snapshot" {
		conn.Close()
		return nil, fmt.Errorf("first frame %q: %v", line, err)
	}
	return conn, nil
}

// TestStreamMemoryPer1000 measures what an open change stream costs the
// process, with 1,000 open at once over an engine of 1,000 AppModels: a
// library key subscription (Engine.Subscribe, its snapshot taken), an idle
// HTTP stream of one key (a client that read the snapshot and reads
// nothing more; the client is a bare TCP connection in this process, so
// the measure is the server's cost plus one socket), and, as the floor of
// the latter, an idle loopback TCP connection (both ends, no HTTP). Live
// heap after a GC and goroutine stacks, before and after, divided by
// 1,000; goroutines likewise. Logged; the only assertion is a generous
// bound on the bytes.
//
//	go test -run StreamMemoryPer1000 -v -count 3 ./cmd/metasync/internal/server/
func TestStreamMemoryPer1000(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 3,000 connections")
	}
	const n = 1000
	base, f, _, s := streamServer(t, time.Hour)
	addr := strings.TrimPrefix(base, "http://")
	objs := make([][]byte, n)
	keys := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprintf("model-%04d", i)
		objs[i] = appModel(fmt.Sprintf("app-%04d", i), keys[i])
	}
	if err := f.Apply("appmodels", objs...); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Library subscriptions.
	before := measureUsage()
	subs := make([]*msync.Subscription, n)
	for i, k := range keys {
		sub, err := s.engine.Subscribe(ctx, msync.KeyOf("model-to-app", k))
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := sub.Next(ctx); err != nil || ev.Type != msync.EventSnapshot || len(ev.Values) != 1 {
			t.Fatalf("first event %+v, %v", ev, err)
		}
		subs[i] = sub
	}
	lib := perOne(before, measureUsage(), n)
	for _, sub := range subs {
		sub.Close()
	}
	subs = nil
	settle()

	// Idle HTTP streams.
	before = measureUsage()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, k := range keys {
		c, err := openStream(addr, k)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	if open := s.engine.Subscriptions().Open; open != n {
		t.Fatalf("%d subscriptions open, want %d", open, n)
	}
	stream := perOne(before, measureUsage(), n)
	for _, c := range conns {
		c.Close()
	}
	conns = conns[:0]
	for deadline := time.Now().Add(10 * time.Second); s.engine.Subscriptions().Open != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscriptions still open after their clients went", s.engine.Subscriptions().Open)
		}
	}
	settle()

	// The floor: idle loopback TCP connections, both ends, no HTTP.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, n)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	settle()
	before = measureUsage()
	var servers []net.Conn
	for range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		servers = append(servers, <-accepted)
	}
	tcp := perOne(before, measureUsage(), n)
	for _, c := range servers {
		c.Close()
	}

	t.Logf("per library key subscription (%d open): heap %.0f B, stacks %.0f B, goroutines %.2f", n, lib.heap, lib.stack, lib.goroutines)
	t.Logf("per idle HTTP stream (%d open):         heap %.0f B, stacks %.0f B, goroutines %.2f", n, stream.heap, stream.stack, stream.goroutines)
	t.Logf("per idle loopback TCP connection, both ends (the floor): heap %.0f B, stacks %.0f B, goroutines %.2f", tcp.heap, tcp.stack, tcp.goroutines)
	if lib.heap > 16<<10 {
		t.Errorf("a key subscription costs %.0f B of heap", lib.heap)
	}
	if stream.heap > 128<<10 {
		t.Errorf("an idle HTTP stream costs %.0f B of heap", stream.heap)
	}
}
