package integration_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// initializing answers the first refuse requests for the ConfigMaps of
// a namespace as an apiserver whose storage is (re)initializing does
// (right after a CRD is installed), and holds the first watch that is no
// list (no sendInitialEvents) for hold: a cluster whose first lists are
// refused, and whose watch comes late.
type initializing struct {
	next    http.RoundTripper
	refuse  atomic.Int64
	hold    time.Duration
	watches atomic.Int64
}

func (r *initializing) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.Contains(req.URL.Path, "/configmaps") {
		return r.next.RoundTrip(req)
	}
	q := req.URL.Query()
	if r.refuse.Add(-1) >= 0 {
		body := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"storage is (re)initializing","reason":"TooManyRequests","code":429}`
		return &http.Response{StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests", Request: req,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body))}, nil
	}
	if q.Get("watch") == "true" && q.Get("sendInitialEvents") == "" && r.watches.Add(1) == 1 {
		select {
		case <-time.After(r.hold):
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return r.next.RoundTrip(req)
}

// TestClusterStatusFollowsTheLastAttempt: a cluster whose first lists
// are refused, then works, is connected and says no error once a list
// worked, even while its watch has not come yet; the resource's own error
// stays until the watch is established, then clears too.
func TestClusterStatusFollowsTheLastAttempt(t *testing.T) {
	testenv.Need(t, env)
	const ns = "cluster-status"
	ensureNamespace(t, env.Kube, ns)
	putConfigMap(t, env.Kube, ns, "c1", "shop")
	rt := &initializing{hold: 8 * time.Second}
	rt.refuse.Store(3)
	west := rest.CopyConfig(env.Config)
	west.WrapTransport = func(next http.RoundTripper) http.RoundTripper { rt.next = next; return rt }
	plan, err := mschema.Compile(&mschema.Config{
		Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/unused/in/code"}},
		Resources: []mschema.Resource{{Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
			Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := runEngineWith(t, plan, env.Config, msync.Options{StaleAfter: 30 * time.Second,
		ClusterConfigs: map[string]*rest.Config{"west": west}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	westOf := func() (msync.ClusterStatus, msync.ResourceStatus) {
		var cs msync.ClusterStatus
		var rs msync.ResourceStatus
		for _, c := range e.Clusters() {
			if c.Name == "west" {
				cs = c
			}
		}
		for _, s := range e.Status() {
			if s.Cluster == "west" {
				rs = s
			}
		}
		return cs, rs
	}
	// Synced, the watch held: the cluster is connected, the resource
	// still tells of its trouble.
	cs, rs := westOf()
	if !cs.Connected || cs.Error != "" || !cs.Synced {
		t.Errorf("west after a list that worked: %+v", cs)
	}
	if rs.Error == "" || rs.ListErrors == 0 {
		t.Errorf("west's resource forgot its trouble before its watch came: %+v", rs)
	}
	testenv.Eventually(t, "the resource's error cleared by an established watch", func() string {
		cs, rs := westOf()
		if !cs.Connected || cs.Error != "" || rs.Error != "" || !rs.Ready {
			return fmt.Sprintf("cluster %+v, resource error %q", cs, rs.Error)
		}
		return ""
	})
}

// TestClusterComesBackTogether: west, with dropAfter, is refused long
// enough for its resources' backoffs to grow apart and its part to leave
// the answers; once it answers again, its two resources come back
// together: a chain through both does not answer without west for long
// after the first is back.
func TestClusterComesBackTogether(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer west.Stop()
	west.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "come-back-together"
	ensureNamespace(t, env.Kube, ns)
	ensureNamespace(t, west.Kube, ns)
	proxy, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(west))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	westCfg := throughProxy(west, proxy)
	westCfg.Timeout = 2 * time.Second
	putConfigMap(t, west.Kube, ns, "w1", "shop")
	applyApp(t, west, ns, "shop", "", 0, "m1")
	plan, err := mschema.Compile(&mschema.Config{
		Clusters: []mschema.Cluster{{Name: "east"}, {Name: "west", Kubeconfig: "/unused", DropAfter: 2 * time.Second}},
		Resources: []mschema.Resource{
			{Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns,
				Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}}},
			{Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels", Namespace: ns,
				Indexes: []mschema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}}},
		},
		Chains: []mschema.Chain{{Name: "model-to-addr", Indexes: []string{"model-to-app", "app-to-addr"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := runEngineWith(t, plan, env.Config, msync.Options{StaleAfter: time.Second,
		ClusterConfigs: map[string]*rest.Config{"west": westCfg}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	chain := func() []string { return e.Inspect().Answer(msync.Target{Chain: "model-to-addr", Key: "m1"}).Values }
	testenv.Eventually(t, "the chain answered", func() string {
		if got := chain(); !slices.Equal(got, []string{"w1:80"}) {
			return fmt.Sprintf("%q", got)
		}
		return ""
	})
	time.Sleep(1500 * time.Millisecond) // the watches established
	if err := proxy.Refuse(true); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "west's part dropped", func() string {
		if got := chain(); len(got) != 0 {
			return fmt.Sprintf("%q", got)
		}
		return ""
	})
	time.Sleep(25 * time.Second) // the backoffs at their longest
	if err := proxy.Refuse(false); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	var first, both time.Duration
	for time.Since(back) < 60*time.Second && both == 0 {
		addr := len(e.Lookup("app-to-addr", "shop")) > 0
		app := len(e.Lookup("model-to-app", "m1")) > 0
		if (addr || app) && first == 0 {
			first = time.Since(back)
		}
		if addr && app {
			both = time.Since(back)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("west back: its first resource after %v, both after %v", first, both)
	if both == 0 {
		t.Fatal("west's resources did not come back within a minute")
	}
	// Each of the two would otherwise come at the end of its own
	// backoff, up to 10 s (a list's) or 30 s (a watch's) apart.
	if both-first > 4*time.Second {
		t.Errorf("west's resources came back %v apart: the chain answered without west meanwhile", both-first)
	}
}
