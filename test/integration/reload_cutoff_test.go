package integration_test

import (
	"context"
	"testing"
	"time"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

// TestReloadOfACutOffResourceStaysStale: a resource cut off from its
// apiserver (stale after StaleAfter) that a reload restarts stays stale:
// its data is still what it last knew.
func TestReloadOfACutOffResourceStaysStale(t *testing.T) {
	testenv.Need(t, env)
	const ns = "cut-reload"
	ensureNamespace(t, env.Kube, ns)
	putConfigMap(t, env.Kube, ns, "c1", "shop")
	proxy, err := testenv.NewProxy("127.0.0.1:0", apiserverAddr(env))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	cfgOf := func(resync time.Duration) *mschema.Plan {
		p, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{
			Name: "configmaps", Version: "v1", Resource: "configmaps", Namespace: ns, Resync: resync,
			Indexes: []mschema.Index{{Name: "app-to-addr", Key: "data.app", Value: "data.addr"}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	kc := throughProxy(env, proxy)
	kc.Timeout = 2 * time.Second
	e := runEngineWith(t, cfgOf(0), kc, msync.Options{StaleAfter: 3 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the watch established
	proxy.BlackHole(true)
	proxy.Reset()
	testenv.Eventually(t, "stale", func() string {
		if !e.Stale() {
			return "fresh"
		}
		return ""
	})
	t.Logf("cut off: stale %v ready %v", e.Stale(), e.Ready())
	if ch, err := e.Reload(cfgOf(time.Hour)); err != nil || len(ch.Restart) != 1 {
		t.Fatalf("Reload = %+v, %v", ch, err)
	}
	st := e.Status()[0]
	t.Logf("right after the reload: Engine.Stale %v, Ready %v, Status.Stale %v, Status.Ready %v, Error %q", e.Stale(), e.Ready(), st.Stale, st.Ready, st.Error)
	time.Sleep(time.Second)
	st = e.Status()[0]
	t.Logf("1s after the reload (still cut off): Engine.Stale %v, Ready %v, Status.Stale %v, Error %q", e.Stale(), e.Ready(), st.Stale, st.Error)
	if !st.Stale || e.Ready() {
		t.Errorf("a restart of a cut-off resource reads fresh/ready")
	}
}
