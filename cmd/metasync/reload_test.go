package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// configMapDir is a folder laid out as the kubelet lays out a ConfigMap
// volume: config.yaml -> ..data/config.yaml, ..data -> ..<version>; an
// update writes a new version folder and swaps the ..data symlink.
type configMapDir struct {
	t       *testing.T
	dir     string
	version int
}

func newConfigMapDir(t *testing.T, content string) *configMapDir {
	c := &configMapDir{t: t, dir: t.TempDir()}
	c.swap(content)
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), c.path()); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *configMapDir) path() string { return filepath.Join(c.dir, "config.yaml") }

// swap publishes content as the kubelet does: a new folder, a new symlink,
// renamed over ..data in one step.
func (c *configMapDir) swap(content string) {
	c.t.Helper()
	c.version++
	v := fmt.Sprintf("..2026_11_30_%02d", c.version)
	if err := os.Mkdir(filepath.Join(c.dir, v), 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, v, "config.yaml"), []byte(content), 0o644); err != nil {
		c.t.Fatal(err)
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(v, tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
}

// stream follows a ?watch=true URL until the test ends and collects its
// frames.
type stream struct {
	mu     sync.Mutex
	frames []map[string]any
	ended  bool
}

func follow(t *testing.T, url string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d", url, resp.StatusCode)
	}
	s := &stream{}
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var f map[string]any
			_ = json.Unmarshal(sc.Bytes(), &f)
			s.mu.Lock()
			s.frames = append(s.frames, f)
			s.mu.Unlock()
		}
		s.mu.Lock()
		s.ended = true
		s.mu.Unlock()
	}()
	return s
}

// types returns the type of each frame so far, and whether the stream ended.
func (s *stream) types() ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, f := range s.frames {
		out = append(out, fmt.Sprint(f["type"]))
	}
	return out, s.ended
}

// metric returns the value of one sample line of /metrics ("" if absent).
func metric(t *testing.T, base, sample string) string {
	t.Helper()
	m := call(t, "GET", base+"/metrics")
	for _, line := range strings.Split(m.raw, "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			return rest
		}
	}
	return ""
}

const reloadNS = "reload-e2e"

// reloadConfig is the config of the reload test: the AppModels of
// reloadNS under labelSelector, and, when gadgetIndex is set, Gadgets
// with that index.
func reloadConfig(listen, labelSelector, gadgetIndex string) string {
	cfg := fmt.Sprintf(`
server:
  listen: %s
resources:
  - name: appmodels
    group: iidp.com
    version: v1
    resource: appmodels
    namespace: %s
    labelSelector: %s
    indexes:
      - name: model-to-app
        key: spec.models
        value: metadata.name
`, listen, reloadNS, labelSelector)
	if gadgetIndex != "" {
		cfg += fmt.Sprintf(`  - name: gadgets
    group: reload.iidp.com
    version: v1
    resource: gadgets
    namespace: %s
    indexes:
      - name: %s
        key: spec.color
`, reloadNS, gadgetIndex)
	}
	return cfg
}

// TestConfigReload runs the real binary on a ConfigMap-style folder and
// swaps its config: an added resource over a second CRD answers within
// 5 s while the first resource's watch is untouched (no watch start, no
// relist, no frame but heartbeats on its stream); a changed label
// selector restarts that resource alone and its index follows; an invalid
// config with three mistakes changes nothing and logs each; a removed
// resource answers 404 and its stream gets gone; ten swaps 100 ms apart
// end in the last config; SIGHUP reads the config again.
func TestConfigReload(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.InstallCRD(t, testenv.LooseCRD("reload.iidp.com", "Gadget", "gadgets"))
	env.Namespace(t, reloadNS)
	objects := filepath.Join(t.TempDir(), "objects.yaml")
	manifest := fmt.Sprintf(`
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: base, namespace: %[1]s, labels: {iidp: iidp, tier: a}}
spec: {type: model, version: "1.7", models: [model1]}
---
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: other, namespace: %[1]s, labels: {iidp: iidp, tier: b}}
spec: {type: model, version: "1.0", models: [model9]}
---
apiVersion: reload.iidp.com/v1
kind: Gadget
metadata: {name: g1, namespace: %[1]s}
spec: {color: red}
`, reloadNS)
	if err := os.WriteFile(objects, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, objects); err != nil {
		t.Fatal(err)
	}

	addr := testenv.FreeAddr(t)
	base := "http://" + addr
	cm := newConfigMapDir(t, reloadConfig(addr, "iidp=iidp", ""))
	d := start(t, nil, "--config", cm.path(), "--kubeconfig", env.WriteKubeconfig(t, ""), "--stream-heartbeat", "500ms")
	waitHTTP(t, d, addr)
	r := &reloadRun{t: t, d: d, cm: cm, addr: addr, base: base}
	values := r.values
	testenv.Eventually(t, "model1 indexed", func() string {
		if got := values("model-to-app", "model1"); got != "[base]" {
			return got
		}
		return ""
	})
	if got := values("model-to-app", "model9"); got != "[other]" {
		t.Fatalf("model9 = %s", got)
	}
	model1 := follow(t, base+"/v1/indexes/model-to-app/keys/model1?watch=true")
	testenv.Eventually(t, "the stream's snapshot", func() string {
		if ft, _ := model1.types(); len(ft) == 0 || ft[0] != "snapshot" {
			return fmt.Sprint(ft)
		}
		return ""
	})
	r.model1 = model1
	r.starts = `metasync_watch_starts_total{resource="appmodels"}`
	r.relists = `metasync_relists_total{resource="appmodels"}`
	r.startsBefore, r.relistsBefore = metric(t, base, r.starts), metric(t, base, r.relists)
	if r.startsBefore == "" || r.relistsBefore == "" {
		t.Fatalf("no %s or %s in /metrics", r.starts, r.relists)
	}

	r.addResource()
	r.changeSelector()
	r.refuseInvalid()
	r.removeResource()
	r.tenSwaps()
	r.unservedResources()
	r.sighup()
}

// reloadRun is the daemon of TestConfigReload, the folder of its config,
// and the stream on model1 that no reload may touch, with appmodels'
// watch starts and relists before the first swap.
type reloadRun struct {
	t                           *testing.T
	d                           *daemon
	cm                          *configMapDir
	addr, base                  string
	model1                      *stream
	starts, relists             string // their metrics
	startsBefore, relistsBefore string
}

// lookup is the daemon's answer for key of index.
func (r *reloadRun) lookup(index, key string) answer {
	return call(r.t, "GET", r.base+"/v1/indexes/"+index+"/keys/"+key)
}

// values is the daemon's values for key of index, or its status code if
// not 200.
func (r *reloadRun) values(index, key string) string {
	a := r.lookup(index, key)
	if a.code != 200 {
		return fmt.Sprint(a.code)
	}
	return fmt.Sprint(a.body["values"])
}

// addResource: 1. a resource and an index over a second CRD are added;
// the added index answers within 5 s, and appmodels' watch is untouched:
// no watch start, no relist, only heartbeats on model1's stream.
func (r *reloadRun) addResource() {
	t, base, cm, addr, model1 := r.t, r.base, r.cm, r.addr, r.model1
	starts, relists, values := r.starts, r.relists, r.values
	cm.swap(reloadConfig(addr, "iidp=iidp", "color-to-gadget"))
	swapped := time.Now()
	for values("color-to-gadget", "red") != "["+reloadNS+"/g1]" {
		if time.Since(swapped) > 5*time.Second {
			t.Fatalf("color-to-gadget red = %s 5 s after the swap", values("color-to-gadget", "red"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the added index answered %v after the swap", time.Since(swapped).Round(time.Millisecond))
	time.Sleep(1500 * time.Millisecond) // heartbeats on the untouched stream
	if got := metric(t, base, starts); got != r.startsBefore {
		t.Errorf("%s moved: %s -> %s", starts, r.startsBefore, got)
	}
	if got := metric(t, base, relists); got != r.relistsBefore {
		t.Errorf("%s moved: %s -> %s", relists, r.relistsBefore, got)
	}
	ft, _ := model1.types()
	for _, f := range ft[1:] {
		if f != "heartbeat" {
			t.Fatalf("the untouched key's stream got %v", ft)
		}
	}
	if len(ft) < 2 {
		t.Errorf("no heartbeat on the untouched stream: %v", ft)
	}
	if got := metric(t, base, "metasync_config_last_reload_successful"); got != "1" {
		t.Errorf("last_reload_successful = %q", got)
	}
	if got := metric(t, base, `metasync_config_reloads_total{result="success"}`); got != "1" {
		t.Errorf(`reloads_total{result="success"} = %q`, got)
	}
}

// changeSelector: 2. a changed label selector restarts that resource
// alone, and its index follows.
func (r *reloadRun) changeSelector() {
	t, base, cm, addr, model1 := r.t, r.base, r.cm, r.addr, r.model1
	starts, startsBefore, values := r.starts, r.startsBefore, r.values
	gadgetStarts := `metasync_watch_starts_total{resource="gadgets"}`
	gadgetsBefore := metric(t, base, gadgetStarts)
	cm.swap(reloadConfig(addr, "iidp=iidp,tier=a", "color-to-gadget"))
	testenv.Eventually(t, "model-to-app follows the new selector", func() string {
		if got := values("model-to-app", "model9"); got != "[]" {
			return "model9 = " + got
		}
		return ""
	})
	if got := values("model-to-app", "model1"); got != "[base]" {
		t.Errorf("model1 = %s after the selector change", got)
	}
	if got := metric(t, base, gadgetStarts); got != gadgetsBefore {
		t.Errorf("the unchanged resource's watch restarted: %s -> %s", gadgetsBefore, got)
	}
	if got := metric(t, base, starts); got == startsBefore {
		t.Errorf("the changed resource's watch did not restart (%s)", got)
	}
	if ft, _ := model1.types(); strings.Contains(strings.Join(ft[1:], ","), "update") {
		t.Errorf("model1's answer did not change, its stream got %v", ft)
	}
}

// refuseInvalid: 3. an invalid config (three mistakes) changes nothing and
// logs each; the running config again changes nothing, and the metric says
// the file is in force again.
func (r *reloadRun) refuseInvalid() {
	t, base, cm, addr, d := r.t, r.base, r.cm, r.addr, r.d
	values := r.values
	cm.swap(strings.Replace(reloadConfig(addr, "iidp=iidp,tier=a", "color-to-gadget"), "version: v1\n    resource: gadgets", "resource: gadgets", 1) +
		"    bogus: 1\nchains:\n  - name: broken\n    indexes: [nope]\n")
	testenv.Eventually(t, "the refused reload", func() string {
		if got := metric(t, base, "metasync_config_last_reload_successful"); got != "0" {
			return "last_reload_successful " + got
		}
		return ""
	})
	logs := d.stderr.String()
	for _, want := range []string{"resources[1].version", "resources[1].bogus", "chains[0].indexes[0]"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the refused reload's log lacks %q", want)
		}
	}
	if got := metric(t, base, `metasync_config_reloads_total{result="failure"}`); got != "1" {
		t.Errorf(`reloads_total{result="failure"} = %q`, got)
	}
	if got := values("color-to-gadget", "red"); got != "["+reloadNS+"/g1]" {
		t.Errorf("an invalid config changed the indexes: red = %s", got)
	}

	// The running config again: nothing to change, and the metric says
	// the file is in force again.
	cm.swap(reloadConfig(addr, "iidp=iidp,tier=a", "color-to-gadget"))
	testenv.Eventually(t, "the running config back", func() string {
		if got := metric(t, base, "metasync_config_last_reload_successful"); got != "1" {
			return "last_reload_successful " + got
		}
		return ""
	})
}

// removeResource: 4. a removed resource answers 404, and its stream gets
// gone.
func (r *reloadRun) removeResource() {
	t, base, cm, addr := r.t, r.base, r.cm, r.addr
	lookup := r.lookup
	red := follow(t, base+"/v1/indexes/color-to-gadget/keys/red?watch=true")
	testenv.Eventually(t, "the gadget stream's snapshot", func() string {
		if ft, _ := red.types(); len(ft) == 0 {
			return "no frame"
		}
		return ""
	})
	cm.swap(reloadConfig(addr, "iidp=iidp,tier=a", ""))
	testenv.Eventually(t, "the removed index", func() string {
		if a := lookup("color-to-gadget", "red"); a.code != 404 {
			return fmt.Sprint(a.code)
		}
		ft, ended := red.types()
		if !ended || ft[len(ft)-1] != "gone" {
			return fmt.Sprintf("stream %v, ended %v", ft, ended)
		}
		return ""
	})
	if got := metric(t, base, "metasync_config_last_reload_successful"); got != "1" {
		t.Errorf("a valid config after an invalid one: last_reload_successful = %q", got)
	}
}

// tenSwaps: 5. ten swaps 100 ms apart end in the last one; model1's
// answer never changed over the reloads.
func (r *reloadRun) tenSwaps() {
	t, cm, addr, model1 := r.t, r.cm, r.addr, r.model1
	lookup, values := r.lookup, r.values
	for i := range 10 {
		cm.swap(reloadConfig(addr, "iidp=iidp,tier=a", fmt.Sprintf("color-%d", i)))
		time.Sleep(100 * time.Millisecond)
	}
	testenv.Eventually(t, "the last of ten configs", func() string {
		if got := values("color-9", "red"); got != "["+reloadNS+"/g1]" {
			return "color-9 red = " + got
		}
		for i := range 9 {
			if a := lookup(fmt.Sprintf("color-%d", i), "red"); a.code != 404 {
				return fmt.Sprintf("color-%d answers %d", i, a.code)
			}
		}
		return ""
	})

	if ft, _ := model1.types(); strings.Contains(strings.Join(ft[1:], ","), "update") {
		t.Errorf("model1's stream got %v over the reloads", ft)
	}
}

// unservedResources: 6. a changed resource whose new GVR is not served is
// not ready (it is not "syncing" forever), and ready again when changed
// back; so is an added resource that is not served, until removed.
func (r *reloadRun) unservedResources() {
	t, base, cm, addr := r.t, r.base, r.cm, r.addr
	values := r.values
	cm.swap(strings.Replace(reloadConfig(addr, "iidp=iidp,tier=a", "color-9"), "resource: appmodels", "resource: nosuchthings", 1))
	testenv.Eventually(t, "/readyz fails for the unserved resource", func() string {
		if a := call(t, "GET", base+"/readyz"); a.code != 503 || !strings.Contains(a.raw, "appmodels") {
			return fmt.Sprintf("%d %s", a.code, a.raw)
		}
		return ""
	})
	cm.swap(reloadConfig(addr, "iidp=iidp,tier=a", "color-9"))
	testenv.Eventually(t, "/readyz back", func() string {
		if a := call(t, "GET", base+"/readyz"); a.code != 200 {
			return fmt.Sprintf("%d %s", a.code, a.raw)
		}
		if got := values("model-to-app", "model1"); got != "[base]" {
			return "model1 = " + got
		}
		return ""
	})

	// An added resource that is not served is not "syncing" forever.
	cm.swap(reloadConfig(addr, "iidp=iidp,tier=a", "color-9") + `  - name: ghosts
    group: reload.iidp.com
    version: v1
    resource: ghosts
    indexes:
      - {name: ghost-color, key: spec.color}
`)
	testenv.Eventually(t, "/readyz fails for the added, unserved resource", func() string {
		if a := call(t, "GET", base+"/readyz"); a.code != 503 || !strings.Contains(a.raw, "ghosts") {
			return fmt.Sprintf("%d %s", a.code, a.raw)
		}
		return ""
	})
	cm.swap(reloadConfig(addr, "iidp=iidp,tier=a", "color-9"))
	testenv.Eventually(t, "/readyz back once it is removed", func() string {
		if a := call(t, "GET", base+"/readyz"); a.code != 200 {
			return fmt.Sprintf("%d %s", a.code, a.raw)
		}
		return ""
	})
}

// sighup: 7. SIGHUP reads the config again; unchanged, it changes nothing.
func (r *reloadRun) sighup() {
	t, d := r.t, r.d
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "SIGHUP handled", func() string {
		if !strings.Contains(d.stderr.String(), "no resource or chain changed") {
			return "not logged"
		}
		return ""
	})
}
