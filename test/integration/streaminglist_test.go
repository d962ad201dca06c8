package integration_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	gosync "sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// streamCounter counts the configmap requests of an engine: LISTs,
// streaming lists (watches with sendInitialEvents) and other watches;
// while refuse is set, it answers each streaming list with it (an HTTP
// status and a Status body) instead of the apiserver.
type streamCounter struct {
	next http.RoundTripper

	mu                       gosync.Mutex
	lists, streamed, watches int
	refuse                   int
	// body, when set, answers each streaming list (200, a watch stream
	// the test wrote) instead of the apiserver.
	body func() string
}

func (c *streamCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/configmaps") {
		return c.next.RoundTrip(r)
	}
	q := r.URL.Query()
	c.mu.Lock()
	refuse := 0
	var body func() string
	switch {
	case q.Get("watch") != "true":
		c.lists++
	case q.Get("sendInitialEvents") == "true":
		c.streamed++
		refuse, body = c.refuse, c.body
	default:
		c.watches++
	}
	c.mu.Unlock()
	if body != nil {
		return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body())), Request: r}, nil
	}
	if refuse != 0 {
		body := fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"refused by the test","reason":"%s","code":%d}`, http.StatusText(refuse), refuse)
		return &http.Response{StatusCode: refuse, Status: fmt.Sprint(refuse), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
	}
	return c.next.RoundTrip(r)
}

func (c *streamCounter) counts() (lists, streamed, watches int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists, c.streamed, c.watches
}

// TestStreamingList: with Options.StreamingList, the engine lists a
// resource by a watch that streams it (no LIST request) and answers as
// after a LIST, follows the writes that come after, and falls back to
// LIST when the apiserver refuses the streaming list (422) or fails it
// (500), in the same list.
func TestStreamingList(t *testing.T) {
	testenv.Need(t, env)
	for _, c := range []struct {
		name   string
		refuse int
		// the LISTs and streaming lists the first sync makes
		lists, streamed int
	}{
		{"served", 0, 0, 1},
		{"refused", http.StatusUnprocessableEntity, 1, 1},
		{"failed", http.StatusInternalServerError, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := "streaming-" + c.name
			env.Namespace(t, ns)
			for i := range 50 {
				createConfigMap(t, ns, fmt.Sprintf("cm-%02d", i), fmt.Sprintf("app-%d", i%5))
			}
			cfg := rest.CopyConfig(env.Config)
			counter := &streamCounter{refuse: c.refuse}
			cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper {
				counter.next = next
				return counter
			}
			e := runEngineWith(t, configMapPlan(t, ns), cfg, msync.Options{StreamingList: true})
			ctx, cancel := context.WithTimeout(context.Background(), 30e9)
			defer cancel()
			if err := e.WaitForSync(ctx); err != nil {
				t.Fatal(err)
			}
			if lists, streamed, _ := counter.counts(); lists != c.lists || streamed != c.streamed {
				t.Errorf("first sync: %d LISTs and %d streaming lists, want %d and %d", lists, streamed, c.lists, c.streamed)
			}
			want := []string{ns + "/cm-02", ns + "/cm-07", ns + "/cm-12", ns + "/cm-17", ns + "/cm-22", ns + "/cm-27", ns + "/cm-32", ns + "/cm-37", ns + "/cm-42", ns + "/cm-47"}
			if got := e.Lookup("cm-app", "app-2"); !slices.Equal(got, want) {
				t.Fatalf("app-2 = %v, want %v", got, want)
			}
			if st := e.Status()[0]; !st.Ready || st.Objects != 50 || st.Lists != 1 {
				t.Errorf("status %+v, want ready, 50 objects, 1 list", st)
			}
			// The watch after the list follows the writes.
			createConfigMap(t, ns, "late", "app-late")
			expect(t, e, "cm-app", "app-late", ns+"/late")
		})
	}
}

// TestStreamingListByTheEvents: a streaming list is the state its initial
// events build: an object deleted among them (an apiserver whose closing
// bookmark comes from a timer sends changes first) is not listed; a
// stream that ends before its closing bookmark (a connection cut), or
// that holds an event it cannot read or an ERROR, is listed again with
// LIST, at once.
func TestStreamingListByTheEvents(t *testing.T) {
	testenv.Need(t, env)
	const ns = "streaming-events"
	env.Namespace(t, ns)
	createConfigMap(t, ns, "real", "app-x")
	cms, err := env.Kube.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := cms.ResourceVersion
	cm := func(typ, name string) string {
		return fmt.Sprintf(`{"type":%q,"object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":%q,"resourceVersion":%q},"data":{"app":"app-x"}}}`+"\n", typ, name, ns, rv)
	}
	end := fmt.Sprintf(`{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"resourceVersion":%q,"annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", rv)
	for _, c := range []struct {
		name, stream string
		lists        int
	}{
		{"deleted among them", cm("ADDED", "real") + cm("ADDED", "gone") + cm("MODIFIED", "gone") + cm("DELETED", "gone") + end, 0},
		{"cut before the bookmark", cm("ADDED", "real"), 1},
		{"cut inside an event", cm("ADDED", "real") + `{"type":"ADDED","object":{"metadata":{"name":"half`, 1},
		{"an event without an object", cm("ADDED", "real") + `{"type":"ADDED","object":"not an object"}` + "\n" + end, 1},
		{"an object that is not JSON", cm("ADDED", "real") + `{"type":"ADDED","object":{"metadata":{"name":"bad",,}}}` + "\n" + end, 1},
		{"an ERROR event", cm("ADDED", "real") + `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410}}` + "\n", 1},
		{"an ERROR event that refuses", `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400}}` + "\n", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := rest.CopyConfig(env.Config)
			counter := &streamCounter{body: func() string { return c.stream }}
			cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper {
				counter.next = next
				return counter
			}
			e := runEngineWith(t, configMapPlan(t, ns), cfg, msync.Options{StreamingList: true})
			ctx, cancel := context.WithTimeout(context.Background(), 30e9)
			defer cancel()
			if err := e.WaitForSync(ctx); err != nil {
				t.Fatal(err)
			}
			if got := e.Lookup("cm-app", "app-x"); !slices.Equal(got, []string{ns + "/real"}) {
				t.Errorf("app-x = %v, want only %s/real", got, ns)
			}
			if lists, streamed, _ := counter.counts(); lists != c.lists || streamed != 1 {
				t.Errorf("%d LISTs and %d streaming lists, want %d and 1", lists, streamed, c.lists)
			}
			if st := e.Status()[0]; !st.Ready || st.Objects != 1 || st.Listed != 1 {
				t.Errorf("status %+v, want ready, 1 object, 1 listed", st)
			}
		})
	}
}

// requestLog records an engine's list requests of configmaps: for each,
// the path and label selector it was made for, and whether it was
// streamed (a watch with sendInitialEvents) or a LIST.
type requestLog struct {
	next http.RoundTripper

	mu     gosync.Mutex
	listed map[string][]string // path?labelSelector -> "list" or "streamed", in order
}

func (l *requestLog) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/configmaps") {
		q := r.URL.Query()
		what := ""
		switch {
		case q.Get("watch") != "true":
			what = "list"
		case q.Get("sendInitialEvents") == "true":
			what = "streamed"
		}
		if what != "" {
			l.mu.Lock()
			k := r.URL.Path + "?" + q.Get("labelSelector")
			l.listed[k] = append(l.listed[k], what)
			l.mu.Unlock()
		}
	}
	return l.next.RoundTrip(r)
}

// TestStreamingListAuto: with Options.StreamingListAuto, the engine
// streams the list of a resource watched whole and lists with LIST the
// one watched in a namespace and the one watched with a label selector;
// each answers what is there.
func TestStreamingListAuto(t *testing.T) {
	testenv.Need(t, env)
	ns := "streaming-auto"
	env.Namespace(t, ns)
	for i := range 10 {
		createConfigMap(t, ns, fmt.Sprintf("cm-%02d", i), "auto-app")
	}
	plan, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{
		{Name: "whole", Version: "v1", Resource: "configmaps", Indexes: []mschema.Index{{Name: "whole-app", Key: "data.app"}}},
		{Name: "namespaced", Version: "v1", Resource: "configmaps", Namespace: ns, Indexes: []mschema.Index{{Name: "ns-app", Key: "data.app"}}},
		{Name: "selected", Version: "v1", Resource: "configmaps", LabelSelector: "!absent", Indexes: []mschema.Index{{Name: "selected-app", Key: "data.app"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(env.Config)
	log := &requestLog{listed: map[string][]string{}}
	cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper {
		log.next = next
		return log
	}
	e := runEngineWith(t, plan, cfg, msync.Options{StreamingListAuto: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30e9)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	got := maps.Clone(log.listed)
	log.mu.Unlock()
	want := map[string][]string{
		"/api/v1/configmaps?":                       {"streamed"},
		"/api/v1/namespaces/" + ns + "/configmaps?": {"list"},
		"/api/v1/configmaps?!absent":                {"list"},
	}
	if !maps.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Errorf("first sync's lists: %v, want %v", got, want)
	}
	var all []string
	for i := range 10 {
		all = append(all, fmt.Sprintf("%s/cm-%02d", ns, i))
	}
	for _, index := range []string{"whole-app", "ns-app", "selected-app"} {
		if got := e.Lookup(index, "auto-app"); !slices.Equal(got, all) {
			t.Errorf("%s: auto-app = %v, want %v", index, got, all)
		}
	}
	// Each follows the writes after its list.
	createConfigMap(t, ns, "late", "auto-late")
	for _, index := range []string{"whole-app", "ns-app", "selected-app"} {
		expect(t, e, index, "auto-late", ns+"/late")
	}
}

// TestStreamingListRefusedStaysRefused: a resource whose streaming list
// the apiserver refused (422) lists with LIST when a reload restarts its
// watch: the apiserver is not asked again.
func TestStreamingListRefusedStaysRefused(t *testing.T) {
	testenv.Need(t, env)
	ns := "streaming-refused"
	env.Namespace(t, ns)
	createConfigMap(t, ns, "cm-1", "refused-app")
	plan := func(extra bool) *mschema.Plan {
		ix := []mschema.Index{{Name: "r-app", Key: "data.app"}}
		if extra {
			ix = append(ix, mschema.Index{Name: "r-app2", Key: "data.app"})
		}
		p, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{Name: "r", Version: "v1", Resource: "configmaps", Namespace: ns, Indexes: ix}}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := rest.CopyConfig(env.Config)
	counter := &streamCounter{refuse: http.StatusUnprocessableEntity}
	cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper {
		counter.next = next
		return counter
	}
	e := runEngineWith(t, plan(false), cfg, msync.Options{StreamingList: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30e9)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	if lists, streamed, _ := counter.counts(); lists != 1 || streamed != 1 {
		t.Fatalf("first sync: %d LISTs and %d streaming lists, want 1 and 1", lists, streamed)
	}
	if _, err := e.Reload(plan(true)); err != nil {
		t.Fatal(err)
	}
	expect(t, e, "r-app2", "refused-app", ns+"/cm-1")
	if lists, streamed, _ := counter.counts(); lists != 2 || streamed != 1 {
		t.Errorf("after the reload: %d LISTs and %d streaming lists, want 2 and 1", lists, streamed)
	}
}
