package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/internal/wire"
	"github.com/iidp/metasync/test/testenv"
)

// TestServeObjectKeysOfTwoClusters runs the daemon on two real control
// planes, the same namespace/name in both: explain and the object routes
// name each object by its key, namespace/name, with its cluster beside
// it (never a prefix of the key); an object by its key answers each
// cluster's, ?cluster= one cluster's, and the engine's own form
// CLUSTER:namespace/name is taken too; the CLI prints the cluster.
func TestServeObjectKeysOfTwoClusters(t *testing.T) {
	testenv.Need(t, env)
	west, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = west.Stop() })
	const ns = "serve-object-keys"
	env.Namespace(t, ns)
	west.Namespace(t, ns)
	put := func(e *testenv.Env, where, name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name},
			Data: map[string]string{"app": "shop", "addr": name + "." + where + ":80", "where": where}}
		if _, err := e.Kube.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put(env, "east", "same")
	put(west, "west", "same")
	put(env, "east", "e1")
	put(west, "west", "w1")

	addr := testenv.FreeAddr(t)
	config := filepath.Join(t.TempDir(), "config.yaml")
	body := fmt.Sprintf(`server:
  listen: %s
clusters:
  - name: east
  - name: west
    kubeconfig: %s
resources:
  - name: configmaps
    version: v1
    resource: configmaps
    namespace: %s
    fields:
      where: data.where
    indexes:
      - name: app-to-addr
        key: data.app
        value: data.addr
`, addr, west.WriteKubeconfig(t, ""), ns)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, nil, "--config", config, "--kubeconfig", env.WriteKubeconfig(t, ""))
	waitHTTP(t, d, addr)
	base := "http://" + addr
	testenv.Eventually(t, "the union of both clusters", func() string {
		a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop")
		if !strings.Contains(a.raw, `"values":["e1.east:80","same.east:80","same.west:80","w1.west:80"]`) {
			return a.raw
		}
		return ""
	})

	explained := func(query string, want ...string) {
		t.Helper()
		a := call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop?explain=true"+query)
		var ans wire.Lookup
		if err := json.Unmarshal([]byte(a.raw), &ans); a.code != 200 || err != nil || len(ans.Steps) != 1 {
			t.Fatalf("explained%s: %d %s", query, a.code, a.raw)
		}
		var got []string
		for _, o := range ans.Steps[0].Objects {
			got = append(got, o.Cluster+" "+o.Key)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) || strings.Contains(a.raw, ":"+ns+"/") {
			t.Fatalf("explained%s: objects %q, want %q: %s", query, got, want, a.raw)
		}
	}
	explained("", "east "+ns+"/e1", "east "+ns+"/same", "west "+ns+"/same", "west "+ns+"/w1")
	explained("&cluster=west", "west "+ns+"/same", "west "+ns+"/w1")

	object := func(name, where string) string {
		return `{"key":"` + ns + `/` + name + `","cluster":"` + where + `","fields":{"where":"` + where + `"}}`
	}
	wantJSON(t, call(t, "GET", base+"/v1/indexes/app-to-addr/keys/shop/objects"), 200,
		`{"index":"app-to-addr","key":"shop","objects":[`+object("e1", "east")+`,`+object("same", "east")+`,`+object("same", "west")+`,`+object("w1", "west")+`]}`)
	wantJSON(t, call(t, "GET", base+"/v1/resources/configmaps/objects/"+ns+"/same"), 200,
		`{"resource":"configmaps","key":"`+ns+`/same","cluster":"east","fields":{"where":"east"},"objects":[`+object("same", "east")+`,`+object("same", "west")+`]}`)
	for _, path := range []string{"/" + ns + "/same?cluster=west", "/west:" + ns + "%2Fsame", "/west:" + ns + "/same?cluster=west"} {
		wantJSON(t, call(t, "GET", base+"/v1/resources/configmaps/objects"+path), 200,
			`{"resource":"configmaps","key":"`+ns+`/same","cluster":"west","fields":{"where":"west"}}`)
	}
	wantJSON(t, call(t, "GET", base+"/v1/resources/configmaps/objects/"+ns+"/w1"), 200,
		`{"resource":"configmaps","key":"`+ns+`/w1","cluster":"west","fields":{"where":"west"}}`)
	if a := call(t, "GET", base+"/v1/resources/configmaps/objects/"+ns+"/w1?cluster=east"); a.code != 404 || !strings.Contains(a.raw, `in cluster east`) {
		t.Fatalf("west's object in east: %d %s", a.code, a.raw)
	}

	// The CLI: the explain tree names each object's cluster; an object of
	// both clusters is a line each.
	out, errOut, code := metasync(t, "get", "--explain", "app-to-addr", "shop", "--server", base)
	for _, want := range []string{"configmaps " + ns + "/same (cluster east, resourceVersion ", "configmaps " + ns + "/same (cluster west, resourceVersion "} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("get --explain = exit %d\n%s%s\nwant %q", code, out, errOut, want)
		}
	}
	out, errOut, code = metasync(t, "get", "--resource", "configmaps", ns+"/same", "--server", base)
	if want := object("same", "east") + "\n" + object("same", "west") + "\n"; code != 0 || out != want {
		t.Fatalf("get --resource = exit %d %q %q, want %q", code, out, errOut, want)
	}
}
