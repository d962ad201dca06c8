package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iidp/metasync/test/testenv"
)

// clustersWalkThrough returns the lines of the sh blocks of
// docs/clusters.md's section "Try it with make run", as written, and
// after each the answer that the page shows for it (a "# {...}" comment
// line, without "# "), or "".
func clustersWalkThrough(t *testing.T) (lines, shown []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "clusters.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Try it with make run\n")
	if !ok {
		t.Fatal("docs/clusters.md has no heading \"Try it with make run\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for {
		var block string
		if _, section, ok = strings.Cut(section, "```sh\n"); !ok {
			break
		}
		block, section, _ = strings.Cut(section, "```")
		for _, l := range strings.Split(block, "\n") {
			switch l = strings.TrimSpace(l); {
			case strings.HasPrefix(l, "# {") && len(shown) > 0:
				shown[len(shown)-1] = strings.TrimPrefix(l, "# ")
			case l != "" && !strings.HasPrefix(l, "#"):
				lines, shown = append(lines, l), append(shown, "")
			}
		}
	}
	if len(lines) == 0 {
		t.Fatal("docs/clusters.md: no sh block under \"Try it with make run\"")
	}
	return lines, shown
}

// makeVars reads the VAR=value words of a make line.
func makeVars(line string) map[string]string {
	vars := map[string]string{}
	for _, w := range strings.Fields(line) {
		if k, v, ok := strings.Cut(w, "="); ok {
			vars[k] = v
		}
	}
	return vars
}

// TestClustersWalkThrough runs docs/clusters.md's walk-through on make
// run's own program: devcluster with two control planes (the flags make
// run CLUSTERS=2 passes, with the test's address and files, and a
// --stale-after of 5 s), then each line of the page, as written but for
// the address and files of this run: make apply (to east, and to west),
// make stop-apiserver and start-apiserver, and curl, whose answer must
// become the one the page shows. West turns stale no sooner than
// --stale-after after its kube-apiserver was stopped, and is shown not
// connected as soon as it is. devcluster's Try block names the page's
// lines.
func TestClustersWalkThrough(t *testing.T) {
	needControlPlane(t)
	lines, shown := clustersWalkThrough(t)
	if lines[0] != "make run CLUSTERS=2" {
		t.Fatalf("docs/clusters.md's walk-through starts with %q: adapt the test", lines[0])
	}
	bin, metasync := binaries(t)
	dir := t.TempDir()
	kubeconfig, control := filepath.Join(dir, "dev-kubeconfig"), filepath.Join(dir, "devcluster.sock")
	addr := testenv.FreeAddr(t)
	const staleAfter = 5 * time.Second
	t.Setenv("METASYNC_STALE_AFTER", staleAfter.String())
	d := startDevcluster(t, "--metasync", metasync, "--listen", addr, "--clusters", "2",
		"--config-copy", filepath.Join(dir, "run-config.yaml"), "--kubeconfig-out", kubeconfig, "--control", control)
	d.waitFor(t, "Ctrl-C stops everything.", 4*time.Minute)
	out := d.out.String()
	for _, line := range lines[1:] {
		printed := strings.ReplaceAll(line, "127.0.0.1:8080", "http://"+addr)
		if !strings.Contains(out, "  "+printed) {
			t.Errorf("devcluster's Try block lacks the page's line %q:\n%s", printed, out)
		}
	}
	base := "http://" + addr
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	var stopped time.Time
	for i, line := range lines[1:] {
		vars := makeVars(line)
		var cmd *exec.Cmd
		switch fields := strings.Fields(line); {
		case fields[0] == "make" && fields[1] == "apply":
			args := []string{"apply", "--kubeconfig", kubeconfig}
			if c := vars["CLUSTER"]; c != "" {
				args = append(args, "--cluster", c)
			}
			cmd = exec.Command(bin, append(args, vars["FILE"])...)
		case fields[0] == "make" && (fields[1] == "stop-apiserver" || fields[1] == "start-apiserver"):
			verb := strings.TrimSuffix(fields[1], "-apiserver")
			cmd = exec.Command(bin, "apiserver", "--control", control, verb, vars["CLUSTER"])
			if verb == "stop" {
				stopped = time.Now()
			}
		case fields[0] == "curl":
			url := strings.Trim(fields[len(fields)-1], `'"`)
			url = strings.Replace(url, "127.0.0.1:8080", base, 1)
			if shown[i+1] == "" {
				if code, body := get(url); code != 200 {
					t.Fatalf("%s: %d %s", line, code, body)
				}
				continue
			}
			waitAnswer(t, line, shown[i+1], func() string { _, body := get(url); return body })
			if strings.Contains(shown[i+1], `"stale":true`) {
				// METASYNC_STALE_AFTER reached metasync: the
				// default (30 s) would take longer.
				if took := time.Since(stopped); took < staleAfter || took > staleAfter+15*time.Second {
					t.Errorf("west stale %s after its kube-apiserver was stopped, --stale-after %s", took, staleAfter)
				}
			}
			continue
		default:
			t.Fatalf("docs/clusters.md: no check of the line %q: add one to the test", line)
		}
		cmd.Dir = root
		if got, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", line, err, got)
		}
		if strings.Contains(line, "stop-apiserver CLUSTER=west") {
			if _, body := get(base + "/v1/clusters"); !regexp.MustCompile(`"name":"west",[^}]*"connected":false`).MatchString(body) {
				t.Errorf("west stopped, /v1/clusters: %s", body)
			}
			if _, body := get(base + "/v1/chains/model-to-endpoints/keys/model9"); strings.Contains(body, `"stale":true`) && time.Since(stopped) < staleAfter {
				t.Errorf("stale at once: %s", body)
			}
		}
	}

	// Ctrl-C stops both control planes and metasync, and removes the
	// kubeconfigs and the control socket.
	kids := descendants(d.cmd.Process.Pid)
	d.kids = append(d.kids, kids...)
	if n := countComm(kids, "kube-apiserver"); n != 2 || countComm(kids, "etcd") != 2 {
		t.Errorf("devcluster runs %d kube-apiservers: %v", n, kids)
	}
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if ps := d.wait(t, time.Minute); ps.ExitCode() != 0 {
		t.Errorf("devcluster ended with %v, want exit 0", ps)
	}
	wantAllGone(t, kids, d.tmp)
	wantEmpty(t, d.tmp)
	for _, f := range []string{kubeconfig, kubeconfig + "-west", control} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s is left after the stop: %v", f, err)
		}
	}
}

// countComm counts the processes named comm.
func countComm(procs []proc, comm string) int {
	n := 0
	for _, p := range procs {
		if p.comm == comm {
			n++
		}
	}
	return n
}

// waitAnswer waits, for up to 90 s (a watch that failed retries with a
// backoff), until answer returns want.
func waitAnswer(t *testing.T, what, want string, answer func() string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	got := answer()
	for got != want && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		got = answer()
	}
	if got != want {
		t.Fatalf("%s: answers\n%s\nthe page shows\n%s", what, got, want)
	}
}
