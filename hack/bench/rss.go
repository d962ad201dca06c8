// Resident memory as a pod's memory limit and `kubectl top` see it: each
// side in its own process, as it would run in a pod. The informer side is
// this program run again as a child (-child informer); the metasync side
// is the `metasync serve` binary. For each, the process's VmRSS after the
// sync and a settling pause, minus that of the same process watching an
// empty namespace, divided by the objects; and the peak (VmHWM).

package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

var (
	rss         = flag.Bool("rss", true, "measure resident memory (VmRSS) of each side in its own process: the informer as a child of this program, metasync as `metasync serve` (-metasync)")
	metasyncBin = flag.String("metasync", "bin/metasync", "the metasync binary for the resident memory rows")
	rssSettle   = flag.Duration("rss-settle", 3*time.Second, "pause after the sync before resident memory is read")
	child       = flag.String("child", "", "internal: run as the informer child process")
	childNS     = flag.String("child-namespace", "", "internal: the child's namespace")
	childConfig = flag.String("child-kubeconfig", "", "internal: the child's kubeconfig")
)

// emptyNS is a namespace without AppModels, for the baselines.
const emptyNS = "bench-empty"

// memory is what /proc says of a process.
type memory struct{ rss, hwm float64 } // bytes

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

// runChild is the informer child: the seed's informer on a namespace, then
// "synced" on stdout, then it waits to be killed.
func runChild() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", *childConfig)
	if err != nil {
		return err
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, *childNS, func(o *metav1.ListOptions) {
		o.LabelSelector = "iidp=iidp"
	})
	inf := factory.ForResource(gvr).Informer()
	if err := inf.AddIndexers(cache.Indexers{"model": func(obj any) ([]string, error) {
		models, _, _ := unstructured.NestedStringSlice(obj.(*unstructured.Unstructured).Object, "spec", "models")
		return models, nil
	}}); err != nil {
		return err
	}
	stop := make(chan struct{})
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		return errors.New("informer did not sync")
	}
	fmt.Println("synced", len(inf.GetStore().ListKeys()))
	select {}
}

// measureProcess starts cmd, waits until ready says so, pauses, and reads
// the process's memory; then kills it.
func measureProcess(cmd *exec.Cmd, ready func() bool) (memory, time.Duration, error) {
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
	return m, synced, err
}

// informerMemory runs the informer child on a namespace.
func informerMemory(kubeconfig, namespace string) (memory, error) {
	cmd := exec.Command(os.Args[0], "-child", "informer", "-child-namespace", namespace, "-child-kubeconfig", kubeconfig)
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
	})
	logf("rss: informer on %s: %s in %s; VmRSS %.1f MiB, VmHWM %.1f MiB", namespace, syncedLine, took.Round(time.Millisecond), m.rss/(1<<20), m.hwm/(1<<20))
	return m, err
}

// metasyncMemory runs `metasync serve` on a namespace and waits for /readyz.
func metasyncMemory(kubeconfig, namespace, dir string) (memory, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return memory{}, err
	}
	addr := ln.Addr().String()
	ln.Close()
	config := filepath.Join(dir, "config-"+namespace+".yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`server: {listen: "%s"}
resources:
  - name: appmodels
    group: iidp.com
    version: v1
    resource: appmodels
    namespace: %s
    labelSelector: iidp=iidp
    indexes:
      - {name: model-to-app, key: spec.models, value: metadata.name}
`, addr, namespace)), 0o600); err != nil {
		return memory{}, err
	}
	cmd := exec.Command(*metasyncBin, "serve", "--config", config, "--kubeconfig", kubeconfig, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	client := &http.Client{Timeout: time.Second}
	m, took, err := measureProcess(cmd, func() bool {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	logf("rss: metasync serve on %s: ready in %s; VmRSS %.1f MiB, VmHWM %.1f MiB", namespace, took.Round(time.Millisecond), m.rss/(1<<20), m.hwm/(1<<20))
	return m, err
}

// measureRSS returns the resident memory rows.
func measureRSS(cfg *rest.Config) ([]row, error) {
	if _, err := os.Stat(*metasyncBin); err != nil {
		return nil, fmt.Errorf("-metasync %s: %w (make bench builds it)", *metasyncBin, err)
	}
	dir, err := os.MkdirTemp("", "bench-rss-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	kubeconfig, err := writeKubeconfig(cfg, dir)
	if err != nil {
		return nil, err
	}
	var im, ie, mm, me memory
	for _, step := range []struct {
		m    *memory
		f    func() (memory, error)
		what string
	}{
		{&ie, func() (memory, error) { return informerMemory(kubeconfig, emptyNS) }, "informer, empty"},
		{&me, func() (memory, error) { return metasyncMemory(kubeconfig, emptyNS, dir) }, "metasync, empty"},
		{&im, func() (memory, error) { return informerMemory(kubeconfig, ns) }, "informer"},
		{&mm, func() (memory, error) { return metasyncMemory(kubeconfig, ns, dir) }, "metasync"},
	} {
		m, err := step.f()
		if err != nil {
			return nil, fmt.Errorf("rss, %s: %w", step.what, err)
		}
		*step.m = m
	}
	per := func(full, empty memory) float64 { return (full.rss - empty.rss) / float64(*n) }
	return []row{
		{name: "resident memory per object (VmRSS − empty)", unit: "B", baseline: per(im, ie), metasync: per(mm, me), target: "≤ 1/12"},
		{name: "peak resident memory during sync (VmHWM)", unit: "MiB", baseline: im.hwm / (1 << 20), metasync: mm.hwm / (1 << 20), target: "≤ 0.5 ×"},
		{name: "resident memory, empty namespace", unit: "MiB", baseline: ie.rss / (1 << 20), metasync: me.rss / (1 << 20), target: "≤ informer"},
	}, nil
}
