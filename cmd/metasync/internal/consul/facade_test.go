package consul

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// facade serves the Consul facade of index service-to-endpoints of
// examples/appmodel's config over an engine without a cluster, on its
// limited listener, as serve does; engine wraps the engine (nil: as is).
func facade(t *testing.T, wrap func(*msync.Engine) Engine) (base string, f *msync.Feed, s *Server) {
	t.Helper()
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	e, f := fake.Engine(), fake.Feed()
	var engine Engine = e.Inspect()
	if wrap != nil {
		engine = wrap(e)
	}
	s = New(engine, []Source{{"indexes", "service-to-endpoints"}}, quiet, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.HTTPServer(nil, quiet)
	go func() { _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close(); s.Close() })
	return "http://" + ln.Addr().String(), f, s
}

// slice is an EndpointSlice of service with one ready endpoint at ip,
// port http 8080.
func slice(name, service, ip string) []byte {
	return fmt.Appendf(nil, `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",
"metadata":{"name":%q,"namespace":"meta-test","labels":{"kubernetes.io/service-name":%q}},
"ports":[{"name":"http","port":8080}],
"endpoints":[{"addresses":[%q],"conditions":{"ready":true}}]}`, name, service, ip)
}

// get reads path, and answers its status, X-Consul-Index and body.
func get(t *testing.T, url string) (code int, index uint64, body string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	index, _ = strconv.ParseUint(resp.Header.Get("X-Consul-Index"), 10, 64)
	return resp.StatusCode, index, string(b)
}

// TestIndexNeverGoesBackwards: a blocking query whose wait runs out
// answers at least the index it sent. Before, it answered its watch's
// index: after a change elsewhere, a read without a wait gives a higher
// index than the watch's state, and the client that blocked on it saw
// its index go backwards (and consul/api's watches start again from 0).
func TestIndexNeverGoesBackwards(t *testing.T) {
	base, f, _ := facade(t, nil)
	if err := f.Apply("endpointslices", slice("a", "model1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	_, i0, _ := get(t, base+"/v1/health/service/model1")
	// A blocking query starts model1's watch, at i0's state.
	if _, i, _ := get(t, base+"/v1/health/service/model1?wait=50ms&index="+fmt.Sprint(i0)); i != i0 {
		t.Fatalf("a wait run out: index %d, want %d", i, i0)
	}
	// A change of another service: model1's answer is the same, the
	// engine's state is newer.
	if err := f.Apply("endpointslices", slice("b", "model2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	_, i1, _ := get(t, base+"/v1/health/service/model1")
	if i1 <= i0 {
		t.Fatalf("a read after a change elsewhere: index %d, want above %d", i1, i0)
	}
	seen := i1
	for _, wait := range []string{"50ms", "0s"} {
		_, i, body := get(t, base+"/v1/health/service/model1?wait="+wait+"&index="+fmt.Sprint(seen))
		if i < seen {
			t.Errorf("wait %s, index %d: answered index %d: backwards", wait, seen, i)
		}
		if !strings.Contains(body, "10.0.0.1") {
			t.Errorf("wait %s: %s", wait, body)
		}
		seen = max(seen, i)
	}
	// A change of model1 after that passes the index the client holds.
	done := make(chan uint64)
	go func() {
		_, i, _ := get(t, base+"/v1/health/service/model1?wait=10s&index="+fmt.Sprint(seen))
		done <- i
	}()
	time.Sleep(50 * time.Millisecond)
	if err := f.Apply("endpointslices", slice("a", "model1", "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	select {
	case i := <-done:
		if i <= seen {
			t.Errorf("after model1 changed: index %d, want above %d", i, seen)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the change did not answer the blocking query")
	}
}

// TestNamesThatAreNoService: a service name longer than MaxServiceName
// is 400; ?wait=0 answers at once; a name that is no service waits (it
// does not answer at once, which would make a client loop) on a watch
// of its own key, as a service does, not on the catalog's (which reads
// the whole index at every write); it answers as soon as the name
// becomes a service.
func TestNamesThatAreNoService(t *testing.T) {
	base, f, s := facade(t, nil)
	if err := f.Apply("endpointslices", slice("a", "model1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if code, _, body := get(t, base+"/v1/health/service/"+strings.Repeat("x", MaxServiceName+1)); code != 400 {
		t.Errorf("a long name: %d %s, want 400", code, body)
	}
	if code, _, _ := get(t, base+"/v1/health/service/"+strings.Repeat("x", MaxServiceName)); code != 200 {
		t.Errorf("a name of %d bytes: %d, want 200", MaxServiceName, code)
	}
	_, index, _ := get(t, base+"/v1/health/service/model1")
	start := time.Now()
	if code, i, _ := get(t, base+"/v1/health/service/model1?wait=0s&index="+fmt.Sprint(index)); code != 200 || i != index || time.Since(start) > time.Second {
		t.Errorf("wait=0: %d, index %d after %v, want 200 at once with %d", code, i, time.Since(start), index)
	}
	if n := s.watches.count.Load(); n != 0 {
		t.Errorf("%d watches after reads without a wait, want 0", n)
	}
	for i := range 200 {
		start := time.Now()
		code, got, body := get(t, base+fmt.Sprintf("/v1/catalog/service/no-such-%d?wait=20ms&index=%d", i, index))
		if code != 200 || strings.TrimSpace(body) != "[]" || got < index {
			t.Fatalf("an unknown service: %d %d %s", code, got, body)
		}
		if took := time.Since(start); took < 20*time.Millisecond {
			t.Fatalf("an unknown service answered after %v: a client would loop", took)
		}
	}
	s.watches.mu.Lock()
	_, catalog := s.watches.all[watchKey{catalog: true}]
	s.watches.mu.Unlock()
	if n := s.watches.count.Load(); n != 200 || catalog {
		t.Errorf("%d watches after 200 names that are no service (the catalog's among them: %v), want 200, one per name, not the catalog's", n, catalog)
	}
	done := make(chan string)
	go func() {
		_, _, body := get(t, base+fmt.Sprintf("/v1/health/service/model9?wait=10s&index=%d", index))
		done <- body
	}()
	time.Sleep(50 * time.Millisecond)
	if err := f.Apply("endpointslices", slice("c", "model9", "10.0.0.9")); err != nil {
		t.Fatal(err)
	}
	select {
	case body := <-done:
		if !strings.Contains(body, "10.0.0.9") {
			t.Errorf("the new service: %s", body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a service that appeared did not answer the query waiting on it")
	}
}

// TestIdleWatchesPerCaller: the watches that one caller's queries leave
// idle are at most maxIdlePerCaller; beyond, that caller's idle longest
// stops.
func TestIdleWatchesPerCaller(t *testing.T) {
	base, f, s := facade(t, nil)
	const n = maxIdlePerCaller + 20
	var objs [][]byte
	for i := range n {
		objs = append(objs, slice(fmt.Sprint("s", i), fmt.Sprint("model", i), "10.0.0.1"))
	}
	if err := f.Apply("endpointslices", objs...); err != nil {
		t.Fatal(err)
	}
	_, index, _ := get(t, base+"/v1/catalog/services")
	for i := range n {
		get(t, base+fmt.Sprintf("/v1/health/service/model%d?wait=1ms&index=%d", i, index))
	}
	if got := s.watches.count.Load(); got > maxIdlePerCaller+1 {
		t.Errorf("%d watches left by one caller, want at most %d (and the catalog's)", got, maxIdlePerCaller)
	}
}

// staleEngine is an engine whose Stale a test sets: while it is, the
// answers of service model1 are stale, cut off for a minute.
type staleEngine struct {
	*msync.Inspector
	stale atomic.Bool
	ch    atomic.Pointer[chan struct{}]
}

func (e *staleEngine) Stale() bool { return e.stale.Load() }

func (e *staleEngine) Answers(ts ...msync.Target) []msync.Answer {
	as := e.Inspector.Answers(ts...)
	for i, t := range ts {
		if t.Key == "model1" {
			as[i].Stale = e.stale.Load()
		}
	}
	return as
}

func (e *staleEngine) Status() []msync.ResourceStatus {
	out := e.Inspector.Status()
	if e.stale.Load() {
		for i := range out {
			if out[i].Name == "endpointslices" {
				out[i].Stale, out[i].ErrorSince = true, time.Now().Add(-time.Minute)
			}
		}
		// Another resource, cut off longer, behind no service: not
		// counted.
		out = append(out, msync.ResourceStatus{Name: "elsewhere", Stale: true, ErrorSince: time.Now().Add(-time.Hour)})
	}
	return out
}

func (e *staleEngine) StaleChanged() <-chan struct{} { return *e.ch.Load() }

func (e *staleEngine) set(stale bool) {
	e.stale.Store(stale)
	ch := make(chan struct{})
	close(*e.ch.Swap(&ch))
}

// TestStaleWakesBlockingQueries: a blocking query answers when its
// answer becomes stale or catches up, so that X-Consul-KnownLeader
// tells it, with the index it sent: the answer is the same.
func TestStaleWakesBlockingQueries(t *testing.T) {
	var se *staleEngine
	base, f, _ := facade(t, func(e *msync.Engine) Engine {
		se = &staleEngine{Inspector: e.Inspect()}
		ch := make(chan struct{})
		se.ch.Store(&ch)
		se.stale.Store(true)
		return se
	})
	if err := f.Apply("endpointslices", slice("a", "model1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply("endpointslices", slice("b", "model2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	// Staleness is the answer's: model1's is stale, model2's is not.
	for _, c := range []struct{ service, leader string }{{"model1", "false"}, {"model2", "true"}} {
		resp, err := http.Get(base + "/v1/health/service/" + c.service)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		contact, _ := strconv.Atoi(resp.Header.Get("X-Consul-LastContact"))
		if got := resp.Header.Get("X-Consul-KnownLeader"); got != c.leader || (c.leader == "false") != (contact >= 60000 && contact < 3600000) {
			t.Errorf("%s: X-Consul-KnownLeader %q, X-Consul-LastContact %d; want %s, and a minute's contact when stale", c.service, got, contact, c.leader)
		}
	}
	_, index, _ := get(t, base+"/v1/health/service/model1")
	type result struct {
		index  uint64
		leader string
	}
	done := make(chan result)
	go func() {
		resp, err := http.Get(base + fmt.Sprintf("/v1/health/service/model1?wait=10s&index=%d", index))
		if err != nil {
			done <- result{}
			return
		}
		resp.Body.Close()
		i, _ := strconv.ParseUint(resp.Header.Get("X-Consul-Index"), 10, 64)
		done <- result{i, resp.Header.Get("X-Consul-KnownLeader")}
	}()
	time.Sleep(50 * time.Millisecond)
	se.set(true) // no change: the query waits on
	time.Sleep(50 * time.Millisecond)
	se.set(false)
	select {
	case r := <-done:
		if r.index != index || r.leader != "true" {
			t.Errorf("after the answer caught up: index %d, X-Consul-KnownLeader %q; want %d and true", r.index, r.leader, index)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the answer caught up: the blocking query went on waiting")
	}
}

// TestStaleOfABlockingAnswer: a blocking query that waits out its wait,
// on a watch read before its answers went stale, answers
// X-Consul-KnownLeader false: the answer's staleness is read when it is
// answered, not when the watch last read its sources; and true again once
// they caught up.
func TestStaleOfABlockingAnswer(t *testing.T) {
	var se *staleEngine
	base, f, _ := facade(t, func(e *msync.Engine) Engine {
		se = &staleEngine{Inspector: e.Inspect()}
		ch := make(chan struct{})
		se.ch.Store(&ch)
		return se
	})
	if err := f.Apply("endpointslices", slice("a", "model1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	_, index, _ := get(t, base+"/v1/health/service/model1")
	leader := func() string {
		t.Helper()
		resp, err := http.Get(base + fmt.Sprintf("/v1/health/service/model1?wait=50ms&index=%d", index))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get("X-Consul-KnownLeader")
	}
	if got := leader(); got != "true" {
		t.Fatalf("before: X-Consul-KnownLeader %q", got)
	}
	se.set(true) // no query waits: the watch, kept, still holds its read
	if got := leader(); got != "false" {
		t.Errorf("stale, the wait run out: X-Consul-KnownLeader %q, want false", got)
	}
	se.set(false)
	if got := leader(); got != "true" {
		t.Errorf("caught up, the wait run out: X-Consul-KnownLeader %q, want true", got)
	}

	// Another service's answer goes stale: a query on model2, whose
	// answer stays current, waits on.
	if err := f.Apply("endpointslices", slice("b", "model2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	_, index2, _ := get(t, base+"/v1/health/service/model2")
	start := time.Now()
	go func() {
		time.Sleep(50 * time.Millisecond)
		se.set(true)
	}()
	resp, err := http.Get(base + fmt.Sprintf("/v1/health/service/model2?wait=400ms&index=%d", index2))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if took := time.Since(start); took < 400*time.Millisecond || resp.Header.Get("X-Consul-KnownLeader") != "true" {
		t.Errorf("model2 while model1 went stale: answered after %v, X-Consul-KnownLeader %q; want its whole wait and true", took, resp.Header.Get("X-Consul-KnownLeader"))
	}
}

// TestNamesNoPathCarries: the catalog leaves out keys that no path can
// ask for (empty, "..", longer than MaxServiceName); an empty name is a
// 400, as Consul answers it.
func TestNamesNoPathCarries(t *testing.T) {
	base, f, _ := facade(t, nil)
	long := strings.Repeat("x", MaxServiceName+1)
	if err := f.Apply("endpointslices", slice("a", "model1", "10.0.0.1"), slice("b", "..", "10.0.0.2"), slice("c", long, "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	_, _, body := get(t, base+"/v1/catalog/services")
	var names map[string][]string
	if err := json.Unmarshal([]byte(body), &names); err != nil {
		t.Fatal(err)
	}
	if _, ok := names["model1"]; !ok || len(names) != 1 {
		t.Errorf("catalog: %s, want model1 alone", body)
	}
	if code, _, body := get(t, base+"/v1/health/service/"); code != http.StatusBadRequest || !strings.Contains(body, "Missing service name") {
		t.Errorf("an empty name: %d %s, want 400 Missing service name", code, body)
	}
}

// TestUnreadAnswerFreesItsConnection: a caller that does not read its
// answer holds its connection for answerWriteTimeout from the answer's
// first byte, not for the server's write timeout (which a blocking query
// needs): then the connection is closed, the answer cut.
func TestUnreadAnswerFreesItsConnection(t *testing.T) {
	was := answerWriteTimeout
	answerWriteTimeout = 200 * time.Millisecond
	t.Cleanup(func() { answerWriteTimeout = was })
	base, f, _ := facade(t, nil)
	var objs [][]byte
	for i := range 2000 {
		objs = append(objs, slice(fmt.Sprint("s", i), "big", fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)))
	}
	if err := f.Apply("endpointslices", objs...); err != nil {
		t.Fatal(err)
	}
	// A small receive window from the start: the answer stalls.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/health/service/big HTTP/1.1\r\nHost: x\r\n\r\n")
	time.Sleep(time.Second) // read nothing, well past the deadline
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	got, err := io.ReadAll(conn)
	var ne net.Error
	// The deadline runs from the status: on a loaded machine the answer
	// may not have reached the socket before it passed, and then the
	// connection closes with nothing sent, which frees it as well.
	if took := time.Since(start); (errors.As(err, &ne) && ne.Timeout()) || took > 4*time.Second || strings.HasSuffix(string(got), "0\r\n\r\n") || len(got) > 0 && !strings.HasPrefix(string(got), "HTTP/1.1 200") {
		t.Errorf("an answer not read for a second: %d bytes (%q...), %v; want the 200 cut and the connection closed when its write deadline passed", len(got), string(got[:min(len(got), 40)]), err)
	}
}
