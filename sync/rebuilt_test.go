package sync

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/iidp/metasync/internal/warmfile"
	mschema "github.com/iidp/metasync/schema"
)

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out: %s", what)
}

// TestChangeSettlesWhenIdentityForbidden: RBAC forbids GET
// namespaces/kube-system; a change found by resourceVersion (an event
// going back) marks the cluster stale, and the lists of its real state
// make it fresh again (no cache to compare: it lists at once).
func TestChangeSettlesWhenIdentityForbidden(t *testing.T) {
	e := testEngine(t, clustersConfig("east", "west"))
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "kube-system", fmt.Errorf("RBAC"))
	e.identOf("west").Fetch = func(context.Context, bool) (string, error) { return "", forbidden }
	w := partOf(t, e, "west")
	listIn(t, w, "100", "w1")
	// An event whose resourceVersion goes back: etcd restored.
	if err := w.Update(w.Project(`{"metadata":{"name":"w1","namespace":"ns","resourceVersion":"50"},"spec":{"type":"model","models":["m-shared"]}}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "west marked stale", w.Stale)
	// The cluster's real state listed, again and again; watchIdentities' settle.
	for i := range 3 {
		listIn(t, w, fmt.Sprint(60+i), "w1")
		e.settleChange(context.Background(), "west")
	}
	t.Logf("after 3 lists: stale=%v pending=%v ready=%v", w.Stale(), e.identOf("west").Changing(), e.Ready())
	if w.Stale() {
		t.Errorf("west stays stale forever: pending=%v", e.identOf("west").Changing())
	}
}

// TestSnapshotOfRebuiltPart: while a change is pending (the apiserver
// serves the old cluster from its cache), a list from that cache is
// written to the snapshot to be listed, never resumed.
func TestSnapshotOfRebuiltPart(t *testing.T) {
	e := testEngine(t, clustersConfig("east", "west"))
	uid := "old-uid"
	e.identOf("west").Fetch = func(_ context.Context, cached bool) (string, error) {
		if cached {
			return "old-uid", nil // the apiserver's cache still serves the old cluster
		}
		return uid, nil
	}
	w := partOf(t, e, "west")
	listIn(t, partOf(t, e, "east"), "100", "e1")
	listIn(t, w, "900", "ghost")
	if _, _, err := e.identOf("west").Reread(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	uid = "new-uid"
	e.identOf("west").RereadAt = time.Time{}
	was, now, _ := e.identOf("west").Reread(context.Background(), 0)
	e.clusterChanged(context.Background(), "west", follow.IdentityWhy(was, now))
	if !w.Stale() || !e.identOf("west").Changing() {
		t.Fatal("not pending")
	}
	// The watcher's run fails with errClusterChanged and lists again: from the old cache.
	listIn(t, w, "901", "ghost")
	var buf bytes.Buffer
	if _, err := e.Inspect().WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := warmfile.Decode(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clusters %+v", f.Clusters)
	for _, r := range f.Resources {
		for _, p := range r.Parts {
			t.Logf("part %+v", p)
			if p.Cluster == "west" && !p.Relist {
				t.Errorf("west's part of the rebuilt cluster written resumable at %s while stale (ghosts)", p.ResourceVersion)
			}
		}
	}
}

// TestReloadWhilePending: a reload while a change is pending; the
// restarted watcher's list (from the apiserver's stale cache) leaves its
// answers stale.
func TestReloadWhilePending(t *testing.T) {
	cfg := clustersConfig("east", "west")
	e := testEngine(t, cfg)
	e.identOf("west").Fetch = func(_ context.Context, cached bool) (string, error) {
		if cached {
			return "old-uid", nil
		}
		return "new-uid", nil
	}
	w := partOf(t, e, "west")
	listIn(t, partOf(t, e, "east"), "100", "e1")
	listIn(t, w, "900", "ghost")
	e.clusterChanged(context.Background(), "west", "test")
	if !w.Stale() {
		t.Fatal("not stale")
	}
	cfg.Resources[0].Resync = time.Hour // restarts the resource
	plan, err := mschema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := e.Reload(plan); err != nil || len(ch.Restart) != 1 {
		t.Fatalf("Reload = %+v, %v", ch, err)
	}
	nw := partOf(t, e, "west")
	t.Logf("after reload, before list: stale=%v", nw.Stale())
	listIn(t, nw, "901", "ghost") // from the apiserver's cache: the old cluster
	a := e.Inspect().Answer(KeyOf("model-to-app", "m-shared"))
	t.Logf("after reload+list: pending=%v stale=%v answer=%+v", e.identOf("west").Changing(), nw.Stale(), a)
	if !nw.Stale() {
		t.Errorf("west fresh after a reload while the change is pending (ghost answered fresh)")
	}
}

// Offline Feed of another cluster: the objects count.
func TestOfflineCount(t *testing.T) {
	cfg := clustersConfig("east", "west")
	plan, err := mschema.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e, f, err := NewOffline(plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.In("west").Apply("appmodels", []byte(`{"metadata":{"name":"a","namespace":"ns"},"spec":{"type":"model","models":["m"]}}`)); err != nil {
		t.Fatal(err)
	}
	for _, st := range e.Status() {
		t.Logf("%s/%s objects=%d", st.Name, st.Cluster, st.Objects)
		if st.Cluster == "west" && st.Objects != 1 {
			t.Errorf("west objects = %d, the source holds 1", st.Objects)
		}
	}
}
