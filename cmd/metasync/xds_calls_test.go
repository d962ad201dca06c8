package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/iidp/metasync/test/testenv"
)

// xdsCallerModeEnv, set to "continuous" beside xdsCallerEnv, makes a
// caller process call without a pause until told to stop (see
// xdsCallerContinuous).
const xdsCallerModeEnv = "METASYNC_TEST_XDS_MODE"

// xdsCallsReport is what a continuous caller prints: per target, its
// calls so far.
type xdsCallsReport struct {
	Targets map[string]*xdsTargetCalls `json:"targets"`
	// Done marks the last report, printed as the caller ends.
	Done bool `json:"done,omitempty"`
}

// xdsTargetCalls counts the calls of one target: answered, by backend;
// failed before the target's first answered call (Waiting: the client
// bootstrapping and asking for its resources), and failed after it
// (Failed), both by "CODE: message". First is how long the first
// answered call took to come, from the target's first call.
type xdsTargetCalls struct {
	Answered map[string]int `json:"answered"`
	Waiting  map[string]int `json:"waiting,omitempty"`
	Failed   map[string]int `json:"failed,omitempty"`
	First    time.Duration  `json:"first,omitempty"`
}

// failed is the number of calls failed after the first answered one.
func (c *xdsTargetCalls) failed() int {
	n := 0
	for _, v := range c.Failed {
		n += v
	}
	return n
}

// xdsCallerContinuous calls the health service at xds:///TARGET (the
// value of xdsCallerEnv) over and over, 10 ms apart, each call with a
// deadline of 2 s, and prints an xdsCallsReport as a JSON line every
// 100 ms. Each line read on its standard input is one more target to
// call, in turn with the others; the end of its input, or
// METASYNC_TEST_XDS_FOR passing, ends it with a last report. It is the
// body of a continuous caller process (see xdsCaller).
func xdsCallerContinuous() int {
	d, err := time.ParseDuration(os.Getenv("METASYNC_TEST_XDS_FOR"))
	if err != nil {
		d = time.Minute
	}
	targets := make(chan string, 16)
	targets <- os.Getenv(xdsCallerEnv)
	stop := make(chan struct{})
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if name := strings.TrimSpace(in.Text()); name != "" {
				targets <- name
			}
		}
		close(stop)
	}()
	type caller struct {
		name  string
		h     healthpb.HealthClient
		since time.Time
		calls *xdsTargetCalls
	}
	var callers []*caller
	report := xdsCallsReport{Targets: map[string]*xdsTargetCalls{}}
	emit := func() {
		b, _ := json.Marshal(report)
		fmt.Println(string(b))
	}
	end := time.After(d)
	printed := time.Now()
	for {
		select {
		case <-stop:
			report.Done = true
			emit()
			return 0
		case <-end:
			report.Done = true
			emit()
			return 0
		case name := <-targets:
			c := &caller{name: name, since: time.Now(), calls: &xdsTargetCalls{Answered: map[string]int{}, Waiting: map[string]int{}, Failed: map[string]int{}}}
			report.Targets[name] = c.calls
			conn, err := grpc.NewClient("xds:///"+name, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				c.calls.Waiting["NewClient: "+err.Error()]++
				continue
			}
			defer conn.Close()
			c.h = healthpb.NewHealthClient(conn)
			callers = append(callers, c)
		default:
		}
		for _, c := range callers {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var p peer.Peer
			_, err := c.h.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
			cancel()
			switch {
			case err == nil:
				if len(c.calls.Answered) == 0 {
					c.calls.First = time.Since(c.since)
				}
				c.calls.Answered[p.Addr.String()]++
			case len(c.calls.Answered) == 0:
				c.calls.Waiting[status.Code(err).String()+": "+status.Convert(err).Message()]++
			default:
				c.calls.Failed[status.Code(err).String()+": "+status.Convert(err).Message()]++
			}
		}
		if time.Since(printed) >= 100*time.Millisecond {
			emit()
			printed = time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// xdsCalls is a continuous caller process (xdsCallerContinuous) and the
// last report it printed.
type xdsCalls struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *testenv.Buffer
	ended  chan struct{}

	mu   gosync.Mutex
	last xdsCallsReport
}

// startXDSCalls starts a continuous caller process of target with
// bootstrap; it is stopped, if still running, when t ends.
func startXDSCalls(t *testing.T, bootstrap, target string) *xdsCalls {
	t.Helper()
	c := &xdsCalls{cmd: xdsCallerCommand(t, bootstrap, target, 2*time.Minute, xdsCallerModeEnv+"=continuous"),
		stderr: &testenv.Buffer{}, ended: make(chan struct{})}
	c.cmd.Stderr = c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.ended)
		lines := bufio.NewScanner(stdout)
		lines.Buffer(nil, 1<<20)
		for lines.Scan() {
			var r xdsCallsReport
			if json.Unmarshal(lines.Bytes(), &r) == nil && r.Targets != nil {
				c.mu.Lock()
				c.last = r
				c.mu.Unlock()
			}
		}
		_ = c.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = c.stdin.Close()
		select {
		case <-c.ended:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.ended
		}
		if t.Failed() {
			t.Logf("xDS caller's last report: %s\nits stderr:\n%s", c.report().String(), c.stderr)
		}
	})
	return c
}

// String is the report as JSON.
func (r xdsCallsReport) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// report is the last report printed; each is a value of its own, never
// changed.
func (c *xdsCalls) report() xdsCallsReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// target is what the last report says of target (all zero before its
// first).
func (c *xdsCalls) target(target string) xdsTargetCalls {
	if tc := c.report().Targets[target]; tc != nil {
		return *tc
	}
	return xdsTargetCalls{}
}

// also makes the caller call target too, in turn with the others.
func (c *xdsCalls) also(t *testing.T, target string) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, target+"\n"); err != nil {
		t.Fatal(err)
	}
}

// window is what the calls of target got in the next 400 ms: the calls
// answered by each backend, and under "failed" those that failed.
func (c *xdsCalls) window(target string) map[string]int {
	before := c.target(target)
	time.Sleep(400 * time.Millisecond)
	after := c.target(target)
	got := map[string]int{}
	for b, n := range after.Answered {
		if d := n - before.Answered[b]; d > 0 {
			got[b] = d
		}
	}
	failed := 0
	for k, n := range after.Failed {
		failed += n - before.Failed[k]
	}
	for k, n := range after.Waiting {
		failed += n - before.Waiting[k]
	}
	if failed > 0 {
		got["failed"] = failed
	}
	return got
}

// waitWindow waits until a window of the calls of target (see window)
// got answers from exactly the backends of want and no failure, and
// returns how long that took.
func (c *xdsCalls) waitWindow(t *testing.T, what, target string, want ...string) time.Duration {
	t.Helper()
	start := time.Now()
	testenv.Eventually(t, what, func() string {
		got := c.window(target)
		if got["failed"] > 0 || len(got) != len(want) {
			return fmt.Sprint(got)
		}
		for _, b := range want {
			if got[b] == 0 {
				return fmt.Sprint(got)
			}
		}
		return ""
	})
	return time.Since(start)
}

// stop ends the caller and returns its last report.
func (c *xdsCalls) stop(t *testing.T) xdsCallsReport {
	t.Helper()
	_ = c.stdin.Close()
	select {
	case <-c.ended:
	case <-time.After(10 * time.Second):
		t.Fatalf("the xDS caller did not stop within 10 s of the end of its input\n%s", c.stderr)
	}
	r := c.report()
	if !r.Done {
		t.Fatalf("the xDS caller ended without its last report: %s\n%s", r, c.stderr)
	}
	return r
}
