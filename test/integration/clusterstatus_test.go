package integration_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
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
