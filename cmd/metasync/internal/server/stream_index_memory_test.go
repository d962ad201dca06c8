package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/internal/wire"
)

// openIndexStream opens a stream of every key of model-to-app on a bare
// TCP connection. With read, it reads the frames up to "synced" (the whole
// index) and then nothing more; without, it reads nothing at all, not even
// the response head, with a small receive buffer: the server's write is
// stuck inside the initial state.
func openIndexStream(addr string, read bool) (net.Conn, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if !read {
		_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	}
	fmt.Fprintf(conn, "GET /v1/indexes/model-to-app/keys?watch=true HTTP/1.1\r\nHost: bench\r\n\r\n")
	if !read {
		return conn, nil
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	frames := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := frames.ReadSlice('\n')
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("before synced: %v", err)
		}
		if strings.Contains(string(line), `"type":"synced"`) {
			return conn, nil
		}
		if !strings.Contains(string(line), `"type":"snapshot"`) {
			var f wire.Frame
			_ = json.Unmarshal(line, &f)
			conn.Close()
			return nil, fmt.Errorf("initial frame %q", line)
		}
	}
}

// TestIndexStreamMemory measures what an idle stream of a whole index
// costs the server at 20,000 and 100,000 keys: streams that read the
// initial state and then idle, and streams whose client reads nothing. The
// server and its engine (without a cluster: metasynctest) run in this
// process, each client is a bare TCP connection; live heap after two GCs
// and goroutine stacks, before and after opening 8 of each, divided by 8
// (after a first stream, which makes what all of them share: the index's
// sorted keys, and the journal of its changes for resuming).
// An idle stream must not hold a copy of the index: its cost must not
// grow with the index, so the bound is far below what a copy costs
// (about 10 MiB at 100,000 keys).
//
//	go test -run IndexStreamMemory -v -count 1 ./cmd/metasync/internal/server/
//
// METASYNC_STREAM_MEMORY_KEYS=N measures at N keys only; under -race
// (make test), 5,000 only.
func TestIndexStreamMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("fills an index of 100,000 keys")
	}
	sizes := []int{20000, 100000}
	if raceEnabled {
		// 100,000 objects take many minutes under -race; 5,000 still
		// tell a copy of the index (about 600 KB) from none.
		sizes = []int{5000}
	}
	if v := os.Getenv("METASYNC_STREAM_MEMORY_KEYS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		sizes = []int{n}
	}
	const streams = 8
	for _, keys := range sizes {
		t.Run(strconv.Itoa(keys), func(t *testing.T) {
			base, f, _, s := streamServer(t, time.Hour)
			addr := strings.TrimPrefix(base, "http://")
			objs := make([][]byte, keys)
			for i := range keys {
				objs[i] = appModel(fmt.Sprintf("app-%06d", i), fmt.Sprintf("model-%06d", i))
			}
			if err := f.Apply("appmodels", objs...); err != nil {
				t.Fatal(err)
			}
			objs = nil
			// The sorted keys are made once per state of the index and
			// shared: not a stream's cost.
			if got := len(s.engine.Keys("model-to-app")); got != keys {
				t.Fatalf("%d keys, want %d", got, keys)
			}
			// So is the journal that the index's streams resume from
			// (made at its first index stream): one stream first, kept.
			first, err := openIndexStream(addr, true)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Close()
			openSubscriptions(t, s, 1)
			for _, read := range []bool{true, false} {
				name := "read the initial state, then idle"
				if !read {
					name = "read nothing"
				}
				settle()
				before := measureUsage()
				conns := make([]net.Conn, 0, streams)
				for range streams {
					c, err := openIndexStream(addr, read)
					if err != nil {
						t.Fatal(err)
					}
					conns = append(conns, c)
				}
				openSubscriptions(t, s, streams+1)
				if !read {
					// Let each handler write until its socket is full.
					for prev := ""; ; {
						time.Sleep(100 * time.Millisecond)
						now := metric(t, base, `metasync_stream_frames_total{type="snapshot"}`)
						if now == prev {
							break
						}
						prev = now
					}
				}
				one := perOne(before, measureUsage(), streams)
				t.Logf("%d keys, per idle index stream (%s): heap %.0f B, stacks %.0f B, goroutines %.2f", keys, name, one.heap, one.stack, one.goroutines)
				if one.heap > 256<<10 {
					t.Errorf("%d keys: an idle index stream (%s) holds %.0f B of heap", keys, name, one.heap)
				}
				for _, c := range conns {
					c.Close()
				}
				openSubscriptions(t, s, 1)
			}
		})
	}
}
