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
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/internal/wire"
	"github.com/iidp/metasync/test/testenv"
)

// applyYAML applies manifests with server-side apply (kubeapply), as the
// platform writes AppModels.
func applyYAML(t *testing.T, objs ...map[string]any) {
	t.Helper()
	var us []*unstructured.Unstructured
	for _, o := range objs {
		us = append(us, &unstructured.Unstructured{Object: o})
	}
	if err := kubeapply.Apply(context.Background(), env.Config, us...); err != nil {
		t.Fatal(err)
	}
}

// appModel is an AppModel of ns claiming models, labelled iidp=iidp.
func appModel(ns, name string, models ...string) map[string]any {
	return map[string]any{
		"apiVersion": "iidp.com/v1", "kind": "AppModel",
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": map[string]any{"iidp": "iidp"}},
		"spec":     map[string]any{"type": "model", "version": "1.7", "models": models},
	}
}

// slice is an EndpointSlice of service svc in ns: port 8080, named http,
// each address ready, hinted for zones[i] when zones is given.
func slice(ns, name, svc string, addrs []string, zones ...[]string) map[string]any {
	var eps []any
	for i, a := range addrs {
		ep := map[string]any{"addresses": []any{a}, "conditions": map[string]any{"ready": true}}
		if i < len(zones) && zones[i] != nil {
			var fz []any
			for _, z := range zones[i] {
				fz = append(fz, map[string]any{"name": z})
			}
			ep["hints"] = map[string]any{"forZones": fz}
		}
		eps = append(eps, ep)
	}
	return map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata":    map[string]any{"name": name, "namespace": ns, "labels": map[string]any{"kubernetes.io/service-name": svc}},
		"addressType": "IPv4", "endpoints": eps,
		"ports": []any{map[string]any{"name": "http", "port": 8080, "protocol": "TCP"}},
	}
}

// TestDaemonExplainsAndNarrows: the daemon, on the reference setup over a
// real control plane, explains an answer over HTTP step by step (a key
// two AppModels claim answers the older, both named with their
// provenance), counts and lists its conflicts (metric, /readyz?verbose)
// until the older lets go, and narrows answers by ?zone= as the
// EndpointSlices' hints say; bad zones and hidden indexes are refused.
func TestDaemonExplainsAndNarrows(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "daemon-explain"
	env.Namespace(t, ns)
	applyYAML(t, appModel(ns, "zeta", "model1", "model2"))
	// creationTimestamp counts seconds: the second claimant is younger.
	time.Sleep(1100 * time.Millisecond)
	applyYAML(t, appModel(ns, "alpha", "model1"), appModel(ns, "hinted", "m-hinted"),
		slice(ns, "zeta-a", "zeta", []string{"10.7.0.1"}),
		slice(ns, "alpha-a", "alpha", []string{"10.7.0.2"}),
		// a and b each have one endpoint, c one hinted for both c and a
		// (as the controller spreads capacity), d none.
		slice(ns, "hinted-1", "hinted", []string{"10.5.0.1", "10.5.0.2", "10.5.0.3"}, []string{"a"}, []string{"b"}, []string{"a", "c"}))

	cfg, err := testenv.ReferenceConfig(ns)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(config, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	d := start(t, nil, "--config", config, "--kubeconfig", env.WriteKubeconfig(t, ""), "--listen", addr)
	waitHTTP(t, d, addr)
	get := func(path string) answer { t.Helper(); return call(t, "GET", base(addr)+path) }
	testenv.Eventually(t, "the chain answers zeta's address", func() string {
		if a := get("/v1/chains/model-to-addresses/keys/model1"); !strings.Contains(a.raw, `"values":["10.7.0.1"]`) {
			return a.raw
		}
		return ""
	})
	metric := func() string {
		for _, line := range strings.Split(get("/metrics").raw, "\n") {
			if strings.HasPrefix(line, `metasync_index_conflicting_keys{index="model-to-app"`) {
				return line[strings.LastIndexByte(line, ' ')+1:]
			}
		}
		return "absent"
	}
	if m := metric(); m != "1" {
		t.Fatalf("metasync_index_conflicting_keys = %s, want 1", m)
	}
	if r := get("/readyz?verbose"); !strings.Contains(r.raw, `"conflicts":[{"index":"model-to-app","count":1,"keys":["model1"]}]`) {
		t.Fatalf("/readyz?verbose = %s", r.raw)
	}

	daemonExplainsChain(t, ns, get)
	daemonNarrowsByZone(t, get)

	// zeta lets go of model1: alpha answers, no conflict; zeta claims it
	// again (older: it answers), then is deleted: alpha, no conflict.
	alphaAnswers := func(what string) {
		t.Helper()
		testenv.Eventually(t, what+": alpha answers, no conflict", func() string {
			if a := get("/v1/chains/model-to-addresses/keys/model1"); !strings.Contains(a.raw, `"values":["10.7.0.2"]`) {
				return a.raw
			}
			if m := metric(); m != "0" {
				return fmt.Sprintf("metasync_index_conflicting_keys = %s", m)
			}
			return ""
		})
	}
	applyYAML(t, appModel(ns, "zeta", "model2"))
	alphaAnswers("zeta let go")
	applyYAML(t, appModel(ns, "zeta", "model1", "model2"))
	testenv.Eventually(t, "zeta answers again, in conflict", func() string {
		if a := get("/v1/chains/model-to-addresses/keys/model1"); !strings.Contains(a.raw, `"values":["10.7.0.1"]`) {
			return a.raw
		}
		if m := metric(); m != "1" {
			return fmt.Sprintf("metasync_index_conflicting_keys = %s", m)
		}
		return ""
	})
	if err := env.Dynamic.Resource(appModelsGVR).Namespace(ns).Delete(context.Background(), "zeta", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	alphaAnswers("zeta deleted")
}

// daemonExplainsChain: the chain model-to-addresses of model1, explained
// step by step, each object of ns at its resourceVersion; get is a GET of
// the daemon.
func daemonExplainsChain(t *testing.T, ns string, get func(path string) answer) {
	rvOf := func(name string) string {
		t.Helper()
		u, err := env.Dynamic.Resource(appModelsGVR).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return u.GetResourceVersion()
	}
	zetaRV, alphaRV := rvOf("zeta"), rvOf("alpha")
	var ans wire.Lookup
	if err := json.Unmarshal([]byte(get("/v1/chains/model-to-addresses/keys/model1?explain=true").raw), &ans); err != nil {
		t.Fatal(err)
	}
	if len(ans.Steps) != 2 || ans.Values == nil || !slices.Equal(*ans.Values, []string{"10.7.0.1"}) {
		t.Fatalf("explained chain: %+v", ans)
	}
	s1, s2 := ans.Steps[0], ans.Steps[1]
	if s1.Index != "model-to-app" || !slices.Equal(s1.Values, []string{"zeta"}) || !slices.Equal(s1.Conflicts, []string{"model1"}) ||
		len(s1.Objects) != 2 || !s1.Objects[0].Chosen || s1.Objects[0].Key != ns+"/zeta" || s1.Objects[0].ResourceVersion != zetaRV ||
		s1.Objects[0].CreationTimestamp == nil || s1.Objects[1].Key != ns+"/alpha" || s1.Objects[1].ResourceVersion != alphaRV || s1.Objects[1].Chosen {
		t.Fatalf("step 1: %+v", s1)
	}
	if s2.Index != "service-to-addresses" || !slices.Equal(s2.Keys, []string{"zeta"}) || len(s2.Objects) != 1 ||
		s2.Objects[0].Key != ns+"/zeta-a" || s2.Objects[0].Resource != "endpointslices" || s2.Objects[0].ResourceVersion == "" {
		t.Fatalf("step 2: %+v", s2)
	}
}

// daemonNarrowsByZone: answers narrowed by the caller's zone as the
// hints say; the hints' index is hidden; a bad zone, or a zone on the keys
// of an index, is refused. get is a GET of the daemon.
func daemonNarrowsByZone(t *testing.T, get func(path string) answer) {
	for path, want := range map[string]string{
		"/v1/chains/model-to-endpoints/keys/m-hinted?zone=a":  `{"chain":"model-to-endpoints","key":"m-hinted","values":["10.5.0.1:8080","10.5.0.3:8080"]}`,
		"/v1/chains/model-to-endpoints/keys/m-hinted?zone=d":  `{"chain":"model-to-endpoints","key":"m-hinted","values":["10.5.0.1:8080","10.5.0.2:8080","10.5.0.3:8080"]}`,
		"/v1/indexes/service-to-addresses/keys/hinted?zone=c": `{"index":"service-to-addresses","key":"hinted","values":["10.5.0.3"]}`,
		"/v1/indexes/service-to-addresses/keys/hinted":        `{"index":"service-to-addresses","key":"hinted","values":["10.5.0.1","10.5.0.2","10.5.0.3"]}`,
	} {
		if a := get(path); a.code != 200 || strings.TrimSpace(a.raw) != want {
			t.Errorf("GET %s = %d %s, want %s", path, a.code, a.raw, want)
		}
	}
	// The hints' index is hidden: not looked up by its name.
	for _, path := range []string{"/v1/indexes/service-to-addresses%2Fhints/keys/hinted", "/v1/indexes/service-to-addresses/hints/keys/hinted"} {
		if a := get(path); a.code != 404 {
			t.Errorf("GET %s = %d %s, want 404", path, a.code, a.raw)
		}
	}
	if a := get("/v1/chains/model-to-endpoints/keys/m-hinted?zone=not%20a%20zone"); a.code != 400 || !strings.Contains(a.raw, `zone \"not a zone\"`) {
		t.Errorf("a bad zone: %d %s", a.code, a.raw)
	}
	if a := get("/v1/indexes/service-to-addresses/keys?zone=a&watch=true"); a.code != 400 || !strings.Contains(a.raw, "zone and node narrow the answer of a key") {
		t.Errorf("a zone on the keys of an index: %d %s", a.code, a.raw)
	}
}
