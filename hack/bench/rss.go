// Resident memory as a pod's memory limit and `kubectl top` see it: each
// side in its own process, as it would run in a pod. The informer side is
// this program run again as a child (-child informer); the metasync side
// is the `metasync serve` binary. For each, the process's VmRSS after the
// sync and a settling pause, minus that of the same process watching an
// empty namespace, divided by the objects; and the peak (VmHWM).

package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

var (
	rss         = flag.Bool("rss", true, "measure resident memory (VmRSS) of each side in its own process: the informer as a child of this program, metasync as `metasync serve` (-metasync)")
	metasyncBin = flag.String("metasync", "bin/metasync", "the metasync binary for the resident memory rows")
	informerBin = flag.String("informer", "bin/bareinformer", "the informer program for the resident memory rows (hack/bareinformer; make bench builds it)")
	churn       = flag.Bool("churn", true, "measure metasync serve's resident memory after churn (every AppModel updated, a tenth deleted and created again) against a fresh process on the same state")
	churnSettle = flag.Duration("churn-settle", 15*time.Second, "pause after the churn before resident memory is read (the daemon looks at its heap every 5 s, and compacts once writes have paused for one look)")
	rssRuns     = flag.Int("rss-runs", 3, "runs of each process for the resident memory rows; the run of median VmRSS counts")
	rssSettle   = flag.Duration("rss-settle", 3*time.Second, "pause after the sync before resident memory is read")
	child       = flag.String("child", "", "internal: \"engines\", run as a child of the rollout rows; \"bare-http\", the bare handler of the HTTP rows")
	childListen = flag.String("child-listen", "", "internal: the bare-http child's address")
	childNS     = flag.String("child-namespace", "", "internal: the child's namespace")
	childConfig = flag.String("child-kubeconfig", "", "internal: the child's kubeconfig")
)

// tunedRSS is the tuned informer's resident memory per object, when
// measureRSS measured it (-tuned), for the tuned table.
var tunedRSS float64

// emptyNS is a namespace without AppModels, for the baselines.
const emptyNS = "bench-empty"

// memory is what /proc says of a process, in bytes: VmRSS, VmHWM, and
// VmRSS's anonymous and file-backed parts (heap and stacks; the binary's
// pages).
type memory struct{ rss, hwm, anon, file float64 }

func procMemory(pid int) (memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	var m memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "VmRSS:":
			m.rss = kb * 1024
		case "VmHWM:":
			m.hwm = kb * 1024
		case "RssAnon:":
			m.anon = kb * 1024
		case "RssFile:":
			m.file = kb * 1024
		}
	}
	return m, sc.Err()
}

// writeKubeconfig writes cfg as a kubeconfig file for the child processes.
func writeKubeconfig(cfg *rest.Config, dir string) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["bench"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "bench"}
	kc.CurrentContext = "bench"
	path := filepath.Join(dir, "kubeconfig")
	return path, clientcmd.WriteToFile(*kc, path)
}

// workDir makes a temporary folder, named after prefix, holding a
// kubeconfig of cfg for the child processes; the caller removes it.
func workDir(cfg *rest.Config, prefix string) (dir, kubeconfig string, err error) {
	if dir, err = os.MkdirTemp("", prefix); err != nil {
		return "", "", err
	}
	if kubeconfig, err = writeKubeconfig(cfg, dir); err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	return dir, kubeconfig, nil
}

// serveConfig writes the bench's metasync config for namespace into dir,
// listening on a free port of the loopback, and returns its path and the
// address.
func serveConfig(dir, namespace string) (path, addr string, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", err
	}
	addr = ln.Addr().String()
	ln.Close()
	path = filepath.Join(dir, "config-"+namespace+".yaml")
	err = os.WriteFile(path, []byte(fmt.Sprintf(`server: {listen: "%s"}
resources:
  - name: appmodels
    group: iidp.com
    version: v1
    resource: appmodels
    namespace: %s
    labelSelector: iidp=iidp
    indexes:
      - {name: model-to-app, key: spec.models, value: metadata.name}
`, addr, namespace)), 0o600)
	return path, addr, err
}

// measureProcess starts cmd, waits until ready says so, pauses, and reads
// the process's memory; then kills it.
func measureProcess(cmd *exec.Cmd, ready func() bool, inspect func()) (memory, time.Duration, error) {
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return memory{}, 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	for !ready() {
		if time.Since(start) > 5*time.Minute {
			return memory{}, 0, errors.New("not synced after 5 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	synced := time.Since(start)
	time.Sleep(*rssSettle)
	m, err := procMemory(cmd.Process.Pid)
	if inspect != nil && err == nil {
		inspect()
	}
	return m, synced, err
}

// informerMemory runs the informer child on a namespace (tuned: with its
// transform).
func informerMemory(kubeconfig, namespace string, tuned bool) (memory, error) {
	// The informer alone, not linked into this program.
	cmd := exec.Command(*informerBin, "-namespace", namespace, "-kubeconfig", kubeconfig, fmt.Sprintf("-tuned=%t", tuned))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return memory{}, err
	}
	cmd.Stderr = os.Stderr
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	syncedLine := ""
	m, took, err := measureProcess(cmd, func() bool {
		select {
		case syncedLine = <-lines:
			return strings.HasPrefix(syncedLine, "synced")
		default:
			return false
		}
	}, nil)
	logf("rss: informer (%s) on %s: %s in %s; VmRSS %.1f MiB (anonymous %.1f, file %.1f), VmHWM %.1f MiB", filepath.Base(cmd.Path), namespace, syncedLine, took.Round(time.Millisecond),
		m.rss/(1<<20), m.anon/(1<<20), m.file/(1<<20), m.hwm/(1<<20))
	return m, err
}

// metasyncMemory runs `metasync serve` on a namespace and waits for /readyz.
func metasyncMemory(kubeconfig, namespace, dir string) (memory, error) {
	config, addr, err := serveConfig(dir, namespace)
	if err != nil {
		return memory{}, err
	}
	cmd := exec.Command(*metasyncBin, "serve", "--config", config, "--kubeconfig", kubeconfig, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	client := &http.Client{Timeout: time.Second}
	var runtimeMem string
	m, took, err := measureProcess(cmd, func() bool {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, func() {
		runtimeMem = goMemory(client, addr)
	})
	logf("rss: metasync serve on %s: ready in %s; VmRSS %.1f MiB (anonymous %.1f, file %.1f), VmHWM %.1f MiB; Go runtime: %s", namespace, took.Round(time.Millisecond),
		m.rss/(1<<20), m.anon/(1<<20), m.file/(1<<20), m.hwm/(1<<20), runtimeMem)
	return m, err
}

// gauges reads the samples of names (metrics without labels) from the
// /metrics of the daemon on addr, in the order asked; a missing one is an
// error.
func gauges(addr string, names ...string) ([]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(names))
	found := make([]bool, len(names))
	for _, line := range strings.Split(string(b), "\n") {
		for i, name := range names {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				out[i], err = strconv.ParseFloat(v, 64)
				found[i] = err == nil
			}
		}
	}
	for i, ok := range found {
		if !ok {
			return nil, fmt.Errorf("%s: no sample of %s in /metrics", addr, names[i])
		}
	}
	return out, nil
}

// goMemory summarizes where the Go runtime of a daemon says its memory
// goes, from its /metrics.
func goMemory(client *http.Client, addr string) string {
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	want := []string{"go_gc_heap_live_bytes", "go_memstats_heap_alloc_bytes", "go_memstats_heap_inuse_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes", "go_memstats_stack_inuse_bytes",
		"go_memstats_mspan_inuse_bytes", "go_memstats_gc_sys_bytes", "go_memstats_other_sys_bytes", "go_memstats_sys_bytes", "go_goroutines"}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, w := range want {
			if v, ok := strings.CutPrefix(line, w+" "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				name := strings.TrimPrefix(strings.TrimPrefix(w, "go_memstats_"), "go_")
				if strings.HasSuffix(w, "_bytes") {
					out = append(out, fmt.Sprintf("%s %.1f MiB", strings.TrimSuffix(name, "_bytes"), f/(1<<20)))
				} else {
					out = append(out, fmt.Sprintf("%s %.0f", name, f))
				}
			}
		}
	}
	return strings.Join(out, ", ")
}

// measureRSS returns the resident memory rows.
func measureRSS(cfg *rest.Config) ([]row, error) {
	for flag, path := range map[string]string{"-metasync": *metasyncBin, "-informer": *informerBin} {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("%s %s: %w (make bench builds it)", flag, path, err)
		}
	}
	dir, kubeconfig, err := workDir(cfg, "bench-rss-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var im, ie, tm, te, mm, me memory
	steps := []struct {
		m    *memory
		f    func() (memory, error)
		what string
	}{
		{&ie, func() (memory, error) { return informerMemory(kubeconfig, emptyNS, false) }, "informer, empty"},
		{&me, func() (memory, error) { return metasyncMemory(kubeconfig, emptyNS, dir) }, "metasync, empty"},
		{&im, func() (memory, error) { return informerMemory(kubeconfig, ns, false) }, "informer"},
		{&mm, func() (memory, error) { return metasyncMemory(kubeconfig, ns, dir) }, "metasync"},
	}
	if *tunedPeer {
		steps = append(steps,
			struct {
				m    *memory
				f    func() (memory, error)
				what string
			}{&te, func() (memory, error) { return informerMemory(kubeconfig, emptyNS, true) }, "tuned informer, empty"},
			struct {
				m    *memory
				f    func() (memory, error)
				what string
			}{&tm, func() (memory, error) { return informerMemory(kubeconfig, ns, true) }, "tuned informer"})
	}
	// Each process runs -rss-runs times, in rounds of all of them, and the
	// run of median VmRSS counts: the same program's resident memory
	// varies by about half a MiB from one start to the next (which pages
	// the runtime touched), as much as 50 B per object at 10,000.
	runs := make([][]memory, len(steps))
	for range max(*rssRuns, 1) {
		for i, step := range steps {
			m, err := step.f()
			if err != nil {
				return nil, fmt.Errorf("rss, %s: %w", step.what, err)
			}
			runs[i] = append(runs[i], m)
		}
	}
	for i, step := range steps {
		ms := runs[i]
		slices.SortFunc(ms, func(a, b memory) int { return cmp.Compare(a.rss, b.rss) })
		*step.m = ms[len(ms)/2]
		if len(ms) > 1 {
			logf("rss: %s: VmRSS %.1f to %.1f MiB in %d runs, median %.1f", step.what, ms[0].rss/(1<<20), ms[len(ms)-1].rss/(1<<20), len(ms), step.m.rss/(1<<20))
		}
	}
	per := func(full, empty memory) float64 { return (full.rss - empty.rss) / float64(*n) }
	if *tunedPeer {
		tunedRSS = per(tm, te)
	}
	return []row{
		{name: "resident memory per object (VmRSS − empty)", unit: "B", baseline: per(im, ie), metasync: per(mm, me), target: ratioAtMost(1.0/20, "≤ 1/20")},
		{name: "peak resident memory during sync (VmHWM)", unit: "MiB", baseline: im.hwm / (1 << 20), metasync: mm.hwm / (1 << 20), target: ratioAtMost(0.5, "≤ 0.5 ×")},
		{name: "resident memory, empty namespace", unit: "MiB", baseline: ie.rss / (1 << 20), metasync: me.rss / (1 << 20), target: ratioAtMost(1, "≤ informer")},
	}, nil
}

// serveProcess is a running `metasync serve` for the churn rows.
type serveProcess struct {
	cmd  *exec.Cmd
	addr string
}

// startServe starts `metasync serve` on namespace and waits for /readyz.
func startServe(kubeconfig, namespace, dir string, flags ...string) (*serveProcess, error) {
	config, addr, err := serveConfig(dir, namespace)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(*metasyncBin, append([]string{"serve", "--config", config, "--kubeconfig", kubeconfig, "--log-level", "warn"}, flags...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &serveProcess{cmd: cmd, addr: addr}
	client := &http.Client{Timeout: time.Second}
	start := time.Now()
	for {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		if time.Since(start) > 5*time.Minute {
			p.stop()
			return nil, errors.New("not ready after 5 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *serveProcess) stop() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }

// sees reports whether the daemon answers model with app.
func (p *serveProcess) sees(model, app string) bool {
	resp, err := http.Get("http://" + p.addr + "/v1/indexes/model-to-app/keys/" + model)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), `"`+app+`"`)
}

// measureChurn runs `metasync serve`, then churns the AppModels: every one
// updated (a model added), a tenth of them deleted and created again; it
// reads VmRSS once the daemon has seen the last write and settled, and
// compares it with a fresh process on the same state. It leaves the
// AppModels as the churn made them.
func measureChurn(ctx context.Context, cfg *rest.Config, dyn dynamic.Interface) ([]row, error) {
	dir, kubeconfig, err := workDir(cfg, "bench-churn-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	p, err := startServe(kubeconfig, ns, dir)
	if err != nil {
		return nil, err
	}
	time.Sleep(*rssSettle)
	before, err := procMemory(p.cmd.Process.Pid)
	if err != nil {
		p.stop()
		return nil, err
	}
	start := time.Now()
	err = inParallel(*n, func(i int) error {
		if i%10 == 0 {
			if err := dyn.Resource(gvr).Namespace(ns).Delete(ctx, fmt.Sprintf("app-%06d", i), metav1.DeleteOptions{}); err != nil {
				return err
			}
		}
		return applyApp(ctx, dyn, i, fmt.Sprintf("churn-%06d", i))
	})
	if err != nil {
		p.stop()
		return nil, err
	}
	last := *n - 1
	for !p.sees(fmt.Sprintf("churn-%06d", last), fmt.Sprintf("app-%06d", last)) {
		if time.Since(start) > 10*time.Minute {
			p.stop()
			return nil, errors.New("the churn's last write not seen after 10 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	writes := *n + *n/10
	logf("churn: %d writes in %s", writes, time.Since(start).Round(time.Millisecond))
	time.Sleep(*churnSettle)
	after, err := procMemory(p.cmd.Process.Pid)
	client := &http.Client{Timeout: 5 * time.Second}
	afterGo := goMemory(client, p.addr)
	p.stop()
	if err != nil {
		return nil, err
	}
	fresh, err := startServe(kubeconfig, ns, dir)
	if err != nil {
		return nil, err
	}
	time.Sleep(*rssSettle)
	again, err := procMemory(fresh.cmd.Process.Pid)
	freshGo := goMemory(client, fresh.addr)
	fresh.stop()
	if err != nil {
		return nil, err
	}
	logf("churn: VmRSS after the sync %.1f MiB, after the churn %.1f MiB (anonymous %.1f; %s), fresh on the same state %.1f MiB (anonymous %.1f; %s)",
		before.rss/(1<<20), after.rss/(1<<20), after.anon/(1<<20), afterGo, again.rss/(1<<20), again.anon/(1<<20), freshGo)
	return []row{
		{name: "metasync serve VmRSS, after the sync | after the churn", unit: "MiB", baseline: before.rss / (1 << 20), metasync: after.rss / (1 << 20), raw: true},
		{name: "after the churn | fresh process, same state", unit: "MiB", baseline: again.rss / (1 << 20), metasync: after.rss / (1 << 20), target: ratioAtMost(1.2, "≤ 1.2 ×")},
	}, nil
}
