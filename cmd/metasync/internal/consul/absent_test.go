package consul

import (
	"fmt"
	"strings"
	gosync "sync"
	"testing"
	"time"

	msync "github.com/iidp/metasync/sync"
)

// readCounter is the engine as the facade reads it, counting the reads
// of whole indexes and those of each key.
type readCounter struct {
	*msync.Inspector
	mu    gosync.Mutex
	whole int
	keys  map[string]int
}

func (e *readCounter) Answers(ts ...msync.Target) []msync.Answer {
	e.mu.Lock()
	for _, t := range ts {
		switch {
		case t.All:
			e.whole++
		case t.Key != "":
			e.keys[t.Key]++
		}
	}
	e.mu.Unlock()
	return e.Inspector.Answers(ts...)
}

// reads is how many reads of whole indexes, and of key, were made.
func (e *readCounter) reads(key string) (whole, ofKey int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.whole, e.keys[key]
}

// TestAbsentNameFollowsItsOwnKey: a blocking query on a name that is no
// service waits on that name's key alone. While other services change,
// it reads neither the index nor its own key again, and when its wait
// runs out it answers [] with the index it sent; it answers as soon as
// the name becomes a service (health and catalog alike).
func TestAbsentNameFollowsItsOwnKey(t *testing.T) {
	var rc *readCounter
	base, f, s := facade(t, func(e *msync.Engine) Engine {
		rc = &readCounter{Inspector: e.Inspect(), keys: map[string]int{}}
		return rc
	})
	if err := f.Apply("endpointslices", slice("a", "model1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	_, index, _ := get(t, base+"/v1/health/service/ghost")

	type result struct {
		code  int
		index uint64
		body  string
		took  time.Duration
	}
	ask := func(path string) <-chan result {
		done := make(chan result, 1)
		go func() {
			start := time.Now()
			code, i, body := get(t, base+path)
			done <- result{code, i, strings.TrimSpace(body), time.Since(start)}
		}()
		return done
	}
	// Its query's watch reads ghost when it starts, and once more at its
	// subscription's first event: then it is quiet.
	settled := func() (whole, ofKey int) {
		t.Helper()
		whole, ofKey = rc.reads("ghost")
		for deadline := time.Now().Add(5 * time.Second); ; {
			time.Sleep(100 * time.Millisecond)
			w, k := rc.reads("ghost")
			if w == whole && k == ofKey {
				return whole, ofKey
			}
			if time.Now().After(deadline) {
				t.Fatalf("the reads of ghost go on: %d then %d", ofKey, k)
			}
			whole, ofKey = w, k
		}
	}

	const wait = 1500 * time.Millisecond
	done := ask(fmt.Sprintf("/v1/health/service/ghost?wait=%v&index=%d", wait, index))
	time.Sleep(50 * time.Millisecond)
	whole, ofKey := settled()
	for i := range 10 {
		if err := f.Apply("endpointslices", slice(fmt.Sprint("o", i), fmt.Sprint("other", i%3), fmt.Sprintf("10.0.1.%d", i+1))); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Delete("endpointslices", "meta-test/o0"); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.code != 200 || r.body != "[]" || r.index != index || r.took < wait {
		t.Errorf("ghost while other services changed: %d %q, index %d after %v; want [] with index %d after its wait (%v)", r.code, r.body, r.index, r.took, index, wait)
	}
	if w, k := rc.reads("ghost"); w != whole || k != ofKey {
		t.Errorf("while other services changed, ghost's query made %d reads of the whole index and %d of its key, want none", w-whole, k-ofKey)
	}
	if whole != 0 {
		t.Errorf("%d reads of the whole index for a query on one name, want none", whole)
	}
	s.watches.mu.Lock()
	_, catalog := s.watches.all[watchKey{catalog: true}]
	s.watches.mu.Unlock()
	if catalog {
		t.Error("a query on one name started the catalog's watch")
	}

	// The name becomes a service: the queries waiting on it answer.
	health := ask(fmt.Sprintf("/v1/health/service/ghost?wait=10s&index=%d", index))
	catalogService := ask(fmt.Sprintf("/v1/catalog/service/ghost?wait=10s&index=%d", index))
	time.Sleep(100 * time.Millisecond)
	if err := f.Apply("endpointslices", slice("g", "ghost", "10.0.0.9")); err != nil {
		t.Fatal(err)
	}
	for name, done := range map[string]<-chan result{"health": health, "catalog": catalogService} {
		select {
		case r := <-done:
			if r.code != 200 || !strings.Contains(r.body, "10.0.0.9") || r.index <= index || r.took > 5*time.Second {
				t.Errorf("%s, once ghost is a service: %d %s, index %d after %v; want its instance, an index above %d", name, r.code, r.body, r.index, r.took, index)
			}
		case <-time.After(8 * time.Second):
			t.Fatalf("%s: ghost became a service, the query waiting on it went on waiting", name)
		}
	}
}

// TestCatalogWatchStartsWithOneRead: a blocking query on
// /v1/catalog/services starts the catalog's watch, whose subscription
// begins with one event per key of the index: the watch reads the index
// once at their end, not once per key.
func TestCatalogWatchStartsWithOneRead(t *testing.T) {
	var rc *readCounter
	base, f, _ := facade(t, func(e *msync.Engine) Engine {
		rc = &readCounter{Inspector: e.Inspect(), keys: map[string]int{}}
		return rc
	})
	var objs [][]byte
	for i := range 500 {
		objs = append(objs, slice(fmt.Sprint("s", i), fmt.Sprint("model", i), "10.0.0.1"))
	}
	if err := f.Apply("endpointslices", objs...); err != nil {
		t.Fatal(err)
	}
	_, index, _ := get(t, base+"/v1/catalog/services")
	done := make(chan uint64, 1)
	go func() {
		_, i, _ := get(t, base+fmt.Sprintf("/v1/catalog/services?wait=10s&index=%d", index))
		done <- i
	}()
	// Let the watch start and take its subscription's first events.
	for last, deadline := -1, time.Now().Add(5*time.Second); ; time.Sleep(200 * time.Millisecond) {
		whole, _ := rc.reads("")
		if whole == last || time.Now().After(deadline) {
			break
		}
		last = whole
	}
	before, _ := rc.reads("")
	// One read without a wait, one when the watch starts, one at its
	// subscription's EventSynced.
	if before > 3 {
		t.Errorf("%d reads of the whole index to start the catalog's watch on 500 keys, want at most 3", before)
	}
	if err := f.Apply("endpointslices", slice("new", "model-new", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	select {
	case i := <-done:
		if i <= index {
			t.Errorf("a service added: index %d, want above %d", i, index)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("a service added: the catalog's blocking query went on waiting")
	}
}
