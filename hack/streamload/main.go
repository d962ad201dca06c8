// Command streamload measures `metasync serve` under many change streams.
// It starts a control plane (the pinned binaries of the tests:
// KUBEBUILDER_ASSETS), -keys ConfigMaps indexed by name (one key each),
// and the given metasync binary, under a file descriptor limit of -fds
// when set (ulimit -n). Then:
//
//   - burst: -burst streams of the whole index (each on a connection of
//     its own, from 127.0.0.1, .2, ... 200 to an address), each read up to
//     its "synced" frame and then left idle; the daemon's resident memory
//     before, with every stream open, and at moments after they all close.
//   - flood (with -flood N): one caller asks for -streams streams of one
//     key, each given 2 s to answer; probes (/livez, /readyz, a lookup)
//     with 2 s each; N connections that send nothing; the probes again;
//     the daemon's open descriptors and what it counted.
//
// Not part of `make test`:
//
//	go build -o /tmp/metasync ./cmd/metasync
//	KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh) go run ./hack/streamload -bin /tmp/metasync
//	KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh) go run ./hack/streamload -bin /tmp/metasync -burst 0 -fds 1024 -streams 1011 -flood 300
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/test/testenv"
)

func main() {
	bin := flag.String("bin", "", "the metasync binary to measure (required)")
	keys := flag.Int("keys", 2000, "ConfigMaps, one index key each")
	burst := flag.Int("burst", 1000, "whole-index streams of the burst (0: none)")
	streams := flag.Int("streams", 1011, "with -flood: key streams that one caller asks for")
	fds := flag.Int("fds", 0, "run the daemon under this file descriptor limit (0: as inherited)")
	flood := flag.Int("flood", 0, "after the burst: one caller's streams, then this many connections that send nothing")
	after := flag.Duration("after", 30*time.Second, "how long to follow resident memory after the streams close")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "streamload: -bin is required")
		os.Exit(2)
	}
	if err := run(*bin, *keys, *burst, *streams, *fds, *flood, *after); err != nil {
		fmt.Fprintln(os.Stderr, "streamload:", err)
		os.Exit(1)
	}
}

const ns = "streamload"

func run(bin string, keys, burst, streams, fds, flood int, after time.Duration) error {
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer env.Stop()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "streamload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := fill(ctx, env, keys); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()
	config := filepath.Join(dir, "config.yaml")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg := fmt.Sprintf(`server: {listen: %q}
resources:
  - name: configmaps
    version: v1
    resource: configmaps
    namespace: %s
    indexes:
      - name: by-name
        key: metadata.name
        value: data.v
`, addr, ns)
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		return err
	}
	logs := &testenv.Buffer{}
	args := []string{"serve", "--config", config, "--kubeconfig", kubeconfig}
	cmd := exec.Command(bin, args...)
	if fds > 0 {
		cmd = exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, fds), bin}, args...)...)
	}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	deadline := time.Now().Add(120 * time.Second)
	for {
		resp, err := probe.Get("http://" + addr + "/v1/indexes")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), fmt.Sprintf(`"keys":%d,"synced":true`, keys)) {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon has not synced %d keys after 120 s:\n%s", keys, logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Printf("binary: %s\nindex: %d keys; daemon's descriptor limit: %s\n", bin, keys, limitOf(fds))
	time.Sleep(2 * time.Second) // the daemon returns the initial lists' garbage
	before := rss(pid)
	fmt.Printf("resident before: %s\n", mib(before))

	if burst > 0 {
		measureBurst(pid, addr, burst, before, after)
	}
	if flood == 0 {
		return nil
	}
	measureFlood(pid, addr, streams, flood, logs)
	return nil
}

// measureBurst opens n whole-index streams, then closes them, and
// follows the daemon's resident memory.
func measureBurst(pid int, addr string, n int, before uint64, after time.Duration) {
	start := time.Now()
	conns, codes := openAll(addr, n, 200, "/v1/indexes/by-name/keys?watch=true", true)
	fmt.Printf("burst: %d whole-index streams asked in %s: %s\n", n, time.Since(start).Round(time.Millisecond), describe(codes))
	time.Sleep(time.Second)
	peak := rss(pid)
	fmt.Printf("resident with them open: %s (%s more per stream)\n", mib(peak), kib((peak-min(peak, before))/max(1, uint64(len(conns)))))
	closed := time.Now()
	for _, c := range conns {
		c.Close()
	}
	for _, at := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second, 60 * time.Second, 90 * time.Second, 120 * time.Second, 150 * time.Second, 180 * time.Second} {
		if at > after {
			break
		}
		time.Sleep(time.Until(closed.Add(at)))
		fmt.Printf("resident %s after they closed: %s\n", at, mib(rss(pid)))
	}
}

// measureFlood: one caller's streams, then a flood of connections that
// send nothing, and probes after each.
func measureFlood(pid int, addr string, streams, flood int, logs *testenv.Buffer) {
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	probes := func(when string) {
		var parts []string
		for _, path := range []string{"/livez", "/readyz", "/v1/indexes/by-name/keys/cm-00001"} {
			t0 := time.Now()
			resp, err := probe.Get("http://" + addr + path)
			if err != nil {
				parts = append(parts, fmt.Sprintf("%s: %v", path, shortErr(err)))
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			parts = append(parts, fmt.Sprintf("%s: %d in %s", path, resp.StatusCode, time.Since(t0).Round(time.Millisecond)))
		}
		fmt.Printf("probes %s: %s\n", when, strings.Join(parts, "; "))
	}
	held, codes := openAll(addr, streams, streams, "/v1/indexes/by-name/keys/cm-00001?watch=true", false)
	fmt.Printf("one caller asks for %d key streams: %s\n", streams, describe(codes))
	probes("with them open")
	var idle []net.Conn
	failed := 0
	for range flood {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.254")}, Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			failed++
			continue
		}
		idle = append(idle, c)
	}
	fmt.Printf("flood: %d connections that send nothing (%d failed to connect)\n", flood, failed)
	probes("during the flood")
	fmt.Printf("daemon's open descriptors: %d; counted: %s\n", openFDs(pid), counted(addr))
	if n := strings.Count(logs.String(), "too many open files"); n > 0 {
		fmt.Printf("daemon logged \"too many open files\" %d times\n", n)
	}
	for _, c := range append(held, idle...) {
		c.Close()
	}
}

// fill creates n ConfigMaps cm-00000... with data v.
func fill(ctx context.Context, env *testenv.Env, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%05d", i)}, Data: map[string]string{"v": fmt.Sprintf("value-%05d", i)}}
				if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// openAll opens n streams of path, perAddr from each loopback address
// (127.0.0.1, then .2, ...), each on a connection of its own, given 2 s
// (or, whole, 60 s) to answer; with whole, each is read up to its "synced"
// frame. It returns the open ones and the count of each outcome.
func openAll(addr string, n, perAddr int, path string, whole bool) ([]net.Conn, map[string]int) {
	var mu sync.Mutex
	var conns []net.Conn
	codes := map[string]int{}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ip := net.IPv4(127, 0, 0, byte(1+i/perAddr))
			c, outcome := openOne(addr, ip, path, whole)
			mu.Lock()
			defer mu.Unlock()
			codes[outcome]++
			if c != nil {
				conns = append(conns, c)
			}
		})
	}
	wg.Wait()
	return conns, codes
}

func openOne(addr string, ip net.IP, path string, whole bool) (net.Conn, string) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, "dial: " + shortErr(err)
	}
	wait := 2 * time.Second
	if whole {
		wait = 60 * time.Second
	}
	_ = c.SetDeadline(time.Now().Add(wait))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
	br := bufio.NewReaderSize(c, 64<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		return nil, "no answer: " + shortErr(err)
	}
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, strconv.Itoa(resp.StatusCode)
	}
	body := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := body.ReadSlice('\n')
		if err != nil {
			c.Close()
			return nil, "broken: " + shortErr(err)
		}
		if !whole || strings.Contains(string(line), `"type":"synced"`) {
			break
		}
	}
	_ = c.SetDeadline(time.Time{})
	return c, "200"
}

func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

func describe(codes map[string]int) string {
	var keys []string
	for k := range codes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d × %s", codes[k], k))
	}
	return strings.Join(parts, ", ")
}

// rss is the resident memory of process pid, in bytes.
func rss(pid int) uint64 { return testenv.Resident(pid) }

func openFDs(pid int) int {
	entries, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(entries)
}

// counted is what the daemon's /metrics says of refusals and evictions.
func counted(addr string) string {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return "no /metrics: " + shortErr(err)
	}
	defer resp.Body.Close()
	var parts []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, prefix := range []string{"metasync_http_refused_total{", "metasync_http_connections_evicted_total ", "metasync_http_connections_open ", "metasync_streams_open "} {
			if strings.HasPrefix(line, prefix) {
				parts = append(parts, line)
			}
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

func limitOf(fds int) string {
	if fds == 0 {
		return "inherited"
	}
	return strconv.Itoa(fds)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b uint64) string { return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10)) }
