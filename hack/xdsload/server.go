package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/iidp/metasync/test/testenv"
)

// server is the xDS server measured: the daemon or the peer, a child
// process.
type server struct {
	name string // "metasync" or "xdspeer"
	cmd  *exec.Cmd
	pid  int
	http string // its HTTP address: /readyz, /metrics
	xds  string
	logs *testenv.Buffer
	// prefix of its metrics: metasync_xds_ or xdspeer_xds_.
	prefix string
}

// startServer starts the daemon (bin) or the peer (peerBin when bin is
// "") on files in dir, and waits until it is ready.
func startServer(bin, peerBin, dir, kubeconfig string) (*server, error) {
	s := &server{http: freeAddr(), xds: freeAddr(), logs: &testenv.Buffer{}}
	if bin != "" {
		cfg, err := testenv.ReferenceConfig(ns)
		if err != nil {
			return nil, err
		}
		config := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(config, cfg, 0o600); err != nil {
			return nil, err
		}
		s.name, s.prefix = "metasync", "metasync_xds_"
		s.cmd = exec.Command(bin, "serve", "--config", config, "--kubeconfig", kubeconfig, "--listen", s.http, "--xds-listen", s.xds, "--log-level", "warn")
	} else {
		s.name, s.prefix = "xdspeer", "xdspeer_xds_"
		s.cmd = exec.Command(peerBin, "-kubeconfig", kubeconfig, "-namespace", ns, "-listen", s.http, "-xds-listen", s.xds)
	}
	s.cmd.Stderr = s.logs
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	s.pid = s.cmd.Process.Pid
	for end := time.Now().Add(120 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get("http://" + s.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s, nil
			}
		}
		if time.Now().After(end) {
			s.stop()
			return nil, fmt.Errorf("%s is not ready after 120 s:\n%s", s.name, s.logs)
		}
	}
}

func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// metric is the value of the first sample line of the server's /metrics
// that starts with name, or "".
func (s *server) metric(name string) string {
	return metricAt(s.http, name)
}

func (s *server) value(name string) float64 {
	v, _ := strconv.ParseFloat(s.metric(name), 64)
	return v
}

func metricAt(addr, name string) string {
	c := http.Client{Timeout: 60 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return rest
		}
	}
	return ""
}

// pushes is the responses of assignments the server counted.
func (s *server) pushes() float64 { return s.value(s.prefix + `pushes_total{type="endpoint"}`) }

// heap is the server's go_memstats_heap_inuse_bytes.
func (s *server) heap() uint64 { return uint64(s.value("go_memstats_heap_inuse_bytes")) }

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// cpuTime is the user and system CPU time of pid.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: utime and
	// stime are the 12th and 13th (clock ticks of 1/100 s).
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	u, _ := strconv.ParseInt(fields[11], 10, 64)
	s, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// machineBusy is the CPU time all cores spent other than idle or
// waiting for I/O, since boot.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var busy int64
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		if i != 3 && i != 4 && i < 8 { // idle, iowait; guest time is in user already
			busy += v
		}
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

func rss(pid int) uint64 { return testenv.Resident(pid) }

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b uint64) string { return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10)) }
