package auth_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/test/authtest"
	"github.com/iidp/metasync/test/testenv"
)

// TestAuthAccessFloodKeepsKnownCallers: callers with valid tokens and no
// access at all (ten tokens of one account, ten identities) ask, 150 at
// once, for made-up paths and made-up indexes, every one different, while
// an authorized caller, whose verdict is cached, keeps asking for longer
// than its verdict lives. The review client has the daemon's limits (50
// QPS, burst 100); the guard's lifetimes are shortened (verdicts 2 s,
// reviews 1.5 s) to keep the test short. The authorized caller gets 200
// every time; the flood 403 or 503.
func TestAuthAccessFloodKeepsKnownCallers(t *testing.T) {
	testenv.Need(t, env)
	reader, _, _ := authtest.Identities(t, env)
	var nobodies []string
	for range 10 {
		nobodies = append(nobodies, authtest.Token(t, env, "nobody"))
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst, cfg.RateLimiter = 50, 100, nil // as serve configures its review client
	kube, c := authtest.CountingKube(t, cfg)
	a := newGuard(t, kube, quietLog())
	a.SetLifetimes(auth.Lifetimes{Positive: 2 * time.Second, Negative: time.Second, Review: 1500 * time.Millisecond})
	h := a.Wrap(offlineServer(t))
	serve := func(path, token string) int {
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := serve("/v1/indexes/model-to-app/keys/model1", reader); code != 200 {
		t.Fatalf("the reader before the flood: %d", code)
	}

	stop := make(chan struct{})
	var codes gosync.Map // status code → *atomic.Int64
	var wg gosync.WaitGroup
	for g := range 150 {
		wg.Go(func() {
			token := nobodies[g%len(nobodies)]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				path := fmt.Sprintf("/x/%d/%d", g, i)
				if i%2 == 1 {
					path = fmt.Sprintf("/v1/indexes/made-up-%d-%d/keys/k", g, i)
				}
				n, _ := codes.LoadOrStore(serve(path, token), &atomic.Int64{})
				n.(*atomic.Int64).Add(1)
			}
		})
	}
	start := time.Now()
	asked, bad := 0, map[int]int{}
	var firstBad time.Duration
	for time.Since(start) < 8*time.Second {
		asked++
		if code := serve(fmt.Sprintf("/v1/indexes/model-to-app/keys/k%d", asked%50), reader); code != 200 {
			bad[code]++
			if firstBad == 0 {
				firstBad = time.Since(start)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	summary := fmt.Sprintf("flood answers %s; the reader asked %d times; %s", codeCounts(&codes), asked, c.Counts())
	t.Log(summary)
	if len(bad) > 0 {
		t.Fatalf("the authorized caller got %v (first after %v) during the flood (%s)", bad, firstBad, summary)
	}
	codes.Range(func(k, _ any) bool {
		if k.(int) != 403 && k.(int) != 503 {
			t.Errorf("a token without access got %d (%s)", k, summary)
		}
		return true
	})
}

// TestAuthFailingRefreshKeepsVerdict: when the refresh of a positive
// verdict fails, the verdict keeps answering past its expiry for the
// grace period, then requests get 503 until a review succeeds again.
func TestAuthFailingRefreshKeepsVerdict(t *testing.T) {
	testenv.Need(t, env)
	reader, _, _ := authtest.Identities(t, env)
	kube, c := authtest.CountingKube(t, env.Config)
	a := newGuard(t, kube, quietLog())
	a.SetLifetimes(auth.Lifetimes{Positive: time.Second, Grace: 1500 * time.Millisecond})
	h := a.Wrap(offlineServer(t))
	serve := func() int {
		req := httptest.NewRequest("GET", "/v1/indexes/model-to-app/keys/model1", nil)
		req.Header.Set("Authorization", "Bearer "+reader)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := serve(); code != 200 {
		t.Fatalf("before the failures: %d", code)
	}
	c.FailTokens.Store(1 << 30)
	c.FailAccess.Store(1 << 30)
	start := time.Now()
	for time.Since(start) < 2*time.Second { // past the expiry, within the grace
		if code := serve(); code != http.StatusOK {
			t.Fatalf("%v after the refreshes began to fail: %d, want 200", time.Since(start), code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second) // past the grace
	if code := serve(); code != http.StatusServiceUnavailable {
		t.Fatalf("past the grace: %d, want 503", code)
	}
	c.FailTokens.Store(0)
	c.FailAccess.Store(0)
	if code := serve(); code != http.StatusOK {
		t.Fatalf("the apiserver back: %d, want 200", code)
	}
}
