package integration_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	gosync "sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// requestCounter counts the LIST and WATCH requests of configmaps that go
// through it; when refuse is set, it answers every watch itself: 200,
// then refuse as the body (an ERROR event, or nothing: a watch that ends
// at once).
type requestCounter struct {
	next   http.RoundTripper
	refuse *string

	mu      gosync.Mutex
	lists   []time.Time // when each LIST was sent
	watches []time.Time // when each WATCH was answered
}

func (c *requestCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/configmaps") {
		return c.next.RoundTrip(r)
	}
	if r.URL.Query().Get("watch") != "true" {
		c.mu.Lock()
		c.lists = append(c.lists, time.Now())
		c.mu.Unlock()
		return c.next.RoundTrip(r)
	}
	var resp *http.Response
	var err error
	if c.refuse != nil {
		resp = &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:  http.Header{"Content-Type": {"application/json"}},
			Body:    io.NopCloser(strings.NewReader(*c.refuse)),
			Request: r}
	} else {
		resp, err = c.next.RoundTrip(r)
	}
	c.mu.Lock()
	c.watches = append(c.watches, time.Now())
	c.mu.Unlock()
	return resp, err
}

// counts returns the LISTs and WATCHes so far.
func (c *requestCounter) counts() (lists, watches int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.lists), len(c.watches)
}

// countingConfig returns a copy of cfg without client-side rate limits (so
// that only the engine's backoff bounds its requests) whose configmap
// requests go through a requestCounter.
func countingConfig(cfg *rest.Config, refuse *string) (*rest.Config, *requestCounter) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	c := &requestCounter{refuse: refuse}
	cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper {
		c.next = next
		return c
	}
	return cfg, c
}

func configMapPlan(t *testing.T, ns string) *mschema.Plan {
	t.Helper()
	plan, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{
		Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
		Indexes: []mschema.Index{{Name: "cm-app", Key: "data.app"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// runEngineWith starts an engine on cfg; the test's cleanup stops it.
func runEngineWith(t *testing.T, plan *mschema.Plan, cfg *rest.Config, opts msync.Options) *msync.Engine {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	e, err := msync.New(plan, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Start did not return 10s after its context ended")
		}
	})
	return e
}

func createConfigMap(t *testing.T, ns, name, app string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"app": app}}
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitStale waits until the engine's only resource has synced and is not
// ready, and returns its status.
func waitStale(t *testing.T, e *msync.Engine) msync.ResourceStatus {
	t.Helper()
	var st msync.ResourceStatus
	testenv.Eventually(t, "synced, then not ready", func() string {
		if st = e.Status()[0]; !st.Synced || st.Ready {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	return st
}

// TestRefusedWatchBacksOffAndGoesStale runs an engine as a user whose RBAC
// Role grants list but not watch: every LIST works and every WATCH is
// refused (403). The engine backs off (a handful of requests in 5 s, where
// relisting after each refusal sends one every half second or faster),
// the resource stops being ready once StaleAfter has passed without an
// established watch (the lists that work do not make it fresh), lookups
// keep answering what was listed, and it is ready again once watch is
// granted.
func TestRefusedWatchBacksOffAndGoesStale(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	ns := "refused-watch"
	env.Namespace(t, ns)
	createConfigMap(t, ns, "listed", "app-1")
	ctx := context.Background()
	role := env.ListOnlyRole(t, ns, "list-only-user")
	_, userCfg := env.UserKubeconfig(t, "list-only-user")
	cfg, counter := countingConfig(userCfg, nil)
	start := time.Now()
	e := runEngineWith(t, configMapPlan(t, ns), cfg, msync.Options{StaleAfter: time.Second})

	expect(t, e, "cm-app", "app-1", ns+"/listed")
	// Over 5 s: how many requests, and does the resource go stale?
	var stale msync.ResourceStatus
	for time.Since(start) < 5*time.Second {
		if st := e.Status()[0]; stale.Name == "" && st.Synced && !st.Ready {
			stale = st
		}
		time.Sleep(20 * time.Millisecond)
	}
	lists, watches := counter.counts()
	t.Logf("in 5s: %d LISTs, %d WATCHes", lists, watches)
	if lists+watches > 12 || lists < 2 {
		t.Fatalf("in 5s: %d LISTs and %d WATCHes, want at most 12 in all (backoff) and a retry", lists, watches)
	}
	if stale.Name == "" {
		t.Fatal("never stale in 5s with StaleAfter 1s")
	}
	if !strings.Contains(stale.Reason, "no established watch") || !strings.Contains(stale.Reason, "forbidden") || stale.WatchErrors == 0 {
		t.Fatalf("stale status = %+v, want a reason that names the refused watch", stale)
	}
	if st := e.Status()[0]; st.Ready || e.Ready() {
		t.Fatalf("ready after 5s: %+v", st)
	}
	// Lookups keep serving the last known state.
	if got := e.Lookup("cm-app", "app-1"); len(got) != 1 {
		t.Fatalf("app-1 -> %q", got)
	}

	// Watch is granted: the engine recovers by itself.
	role.Rules[0].Verbs = append(role.Rules[0].Verbs, "watch")
	if _, err := env.Kube.RbacV1().Roles(ns).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "ready once watch is granted", func() string {
		if st := e.Status()[0]; !st.Ready || st.Error != "" {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	createConfigMap(t, ns, "watched", "app-2")
	expect(t, e, "cm-app", "app-2", ns+"/watched")
}

// TestWatchEndingAtOnceBacksOff: the apiserver accepts every watch, then
// ends it at once with an ERROR event, or with nothing. client-go's
// reflector returns no error for either and lists again; the engine
// counts each as a failure: it backs off (a few requests in 3 s, where
// relisting at once sends thousands), records the watch error, and goes
// stale. A 410 Gone (compaction) is relisted at once the first time, and
// backs off when it repeats.
func TestWatchEndingAtOnceBacksOff(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	status := func(code int, reason, msg string) string {
		return fmt.Sprintf(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"reason":%q,"code":%d}}`+"\n", msg, reason, code)
	}
	cases := []struct {
		name, body, reason string
		prompt             bool // the first relist comes without a backoff
	}{
		{"forbidden-event", status(403, "Forbidden", "configmaps is forbidden: refused in the stream"), "refused in the stream", false},
		{"internal-error-event", status(500, "InternalError", "etcd is sulking"), "etcd is sulking", false},
		{"ends-at-once", "", "of its start", false},
		{"gone-event", status(410, "Expired", "too old resource version: 1 (2)"), "too old resource version", true},
		// An event, then an error, on every watch: no watch stays up, so
		// the resource must go stale all the same. (A bookmark ahead of
		// any list: one behind it would tell of another history.)
		{"event-then-error", `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"999999999"}}}` + "\n" +
			status(500, "InternalError", "etcd is sulking after an event"), "after an event", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := "ends-at-once-" + tc.name
			env.Namespace(t, ns)
			cfg, counter := countingConfig(env.Config, &tc.body)
			start := time.Now()
			e := runEngineWith(t, configMapPlan(t, ns), cfg, msync.Options{StaleAfter: time.Second})
			st := waitStale(t, e)
			if !strings.Contains(st.Reason, "no established watch") || !strings.Contains(st.Reason, tc.reason) || st.WatchErrors == 0 {
				t.Fatalf("status = %+v, want a stale resource whose reason has %q", st, tc.reason)
			}
			time.Sleep(time.Until(start.Add(3 * time.Second)))
			// The trouble began with the first failure and no watch has
			// worked since: an event between failures must not restart
			// the clock (else StaleAfter, longer than the backoff, never
			// passes).
			if st := e.Status()[0]; time.Since(st.ErrorSince) < 2*time.Second {
				t.Fatalf("after 3s the trouble is said to have begun %s ago: %+v", time.Since(st.ErrorSince).Round(time.Millisecond), st)
			}
			lists, watches := counter.counts()
			t.Logf("in 3s: %d LISTs, %d WATCHes", lists, watches)
			if lists+watches > 10 || lists < 2 {
				t.Fatalf("in 3s: %d LISTs and %d WATCHes, want at most 10 in all (backoff) and a retry", lists, watches)
			}
			if tc.prompt {
				counter.mu.Lock()
				gap := counter.lists[1].Sub(counter.watches[0])
				counter.mu.Unlock()
				// The shortest backoff is 500ms.
				if gap >= 490*time.Millisecond {
					t.Fatalf("the first 410 was relisted after %s, want at once", gap)
				}
			}
		})
	}
}

// holdFirst delays the first configmaps request of one kind (LIST or
// WATCH) until the caller's context ends, after telling held: a stop that
// comes while that request is on its way.
type holdFirst struct {
	next  http.RoundTripper
	watch bool
	held  chan struct{}
	once  gosync.Once
}

func (h *holdFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/configmaps") && (r.URL.Query().Get("watch") == "true") == h.watch {
		hold := false
		h.once.Do(func() { hold = true })
		if hold {
			close(h.held)
			select {
			case <-r.Context().Done():
				return nil, r.Context().Err()
			case <-time.After(10 * time.Second):
			}
		}
	}
	return h.next.RoundTrip(r)
}

// TestStopIsNotTrouble stops healthy engines by cancelling their context:
// while the first LIST is on its way, while a WATCH request is, and while
// the watch is established. None logs a warning or records an error.
func TestStopIsNotTrouble(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	ns := "stop-quietly"
	env.Namespace(t, ns)
	createConfigMap(t, ns, "one", "app-1")
	plan := configMapPlan(t, ns)
	for _, phase := range []string{"during-list", "during-watch-request", "watching"} {
		t.Run(phase, func(t *testing.T) {
			var logs testenv.Buffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			cfg := rest.CopyConfig(env.Config)
			h := &holdFirst{watch: phase == "during-watch-request", held: make(chan struct{})}
			if phase != "watching" {
				cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper {
					h.next = next
					return h
				}
			}
			e, err := msync.New(plan, cfg, msync.Options{Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- e.Start(ctx) }()
			if phase == "watching" {
				testenv.Eventually(t, "a watch established", func() string {
					if st := e.Status()[0]; st.Watches == 0 || !st.Ready {
						return fmt.Sprintf("%+v", st)
					}
					return ""
				})
				time.Sleep(1500 * time.Millisecond)
			} else {
				select {
				case <-h.held:
				case <-time.After(20 * time.Second):
					t.Fatal("the request to stop during never came")
				}
			}
			st := e.Status()[0]
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Start did not return 10s after its context ended")
			}
			out := logs.String()
			t.Log(out)
			if strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") || strings.Contains(out, "context canceled") {
				t.Fatalf("a normal stop logged trouble:\n%s", out)
			}
			if after := e.Status()[0]; after.Error != "" || after.ListErrors != st.ListErrors || after.WatchErrors != st.WatchErrors {
				t.Fatalf("a normal stop recorded an error: %+v", after)
			}
		})
	}
}
