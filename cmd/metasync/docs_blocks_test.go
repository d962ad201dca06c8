package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// shellLines returns the lines of every sh block of a page, a leading
// "$ " taken off, with the line after each (the answer a comment shows,
// or "").
func shellLines(t *testing.T, path string) (lines, after []string) {
	t.Helper()
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rest := string(body)
	for {
		var block string
		var ok bool
		if _, rest, ok = strings.Cut(rest, "```sh\n"); !ok {
			return lines, after
		}
		block, rest, _ = strings.Cut(rest, "```")
		ls := strings.Split(block, "\n")
		for i, l := range ls {
			l = strings.TrimPrefix(strings.TrimSpace(l), "$ ")
			if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "{") {
				continue // a comment, or a stream's answer as shown
			}
			next := ""
			if i+1 < len(ls) {
				next = strings.TrimSpace(ls[i+1])
			}
			lines, after = append(lines, l), append(after, next)
		}
	}
}

// optional is a flag shown as optional: [--flag VALUE].
var optional = regexp.MustCompile(`\[[^\]]*\]`)

// TestDocsShellBlocks runs the lines of every sh block of the README and
// of docs/, as written, against a daemon serving examples/appmodel on its
// sample objects (for the address 127.0.0.1:8080 the pages name, a free
// one), and fails on a line it does not know how to check, so that a new
// block is checked too:
//
//   - `bin/metasync get`, `indexes`, `version`: exit 0, something on
//     stdout, nothing on stderr (`--watch`: until its first answer);
//   - `bin/metasync validate`: exit 0;
//   - `bin/metasync serve`: starts and gets ready with the flags shown
//     (optional ones in brackets left out, a folder of its own for
//     --snapshot-dir);
//   - `curl`: 200, and the body the next line's comment shows; a stream
//     (?watch=true) its snapshot frame;
//   - `make TARGET`: the Makefile has the target; `kubectl apply -f` and
//     `go run`: the files and packages exist (the examples' own tests run
//     them);
//   - the xDS walk-through's client lines (`GRPC_XDS_BOOTSTRAP=...`):
//     the programs exist; hack/devcluster's TestXDSWalkThrough runs them
//     against make run's program;
//   - docs/clusters.md's curl lines, of the walk-through of make run
//     CLUSTERS=2: hack/devcluster's TestClustersWalkThrough runs them.
func TestDocsShellBlocks(t *testing.T) {
	testenv.Need(t, env)
	root := testenv.Root()
	env.InstallCRDFile(t, filepath.Join(root, "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, "meta-test")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, filepath.Join(root, "examples", "appmodel", "samples.yaml"), filepath.Join(root, "examples", "appmodel", "routing.yaml")); err != nil {
		t.Fatal(err)
	}
	kubeconfig := env.WriteKubeconfig(t, "")
	config := filepath.Join(root, "examples", "appmodel", "config.yaml")
	addr := testenv.FreeAddr(t)
	d := start(t, nil, "--config", config, "--kubeconfig", kubeconfig, "--listen", addr)
	dd := &docsDaemon{addr: addr, kubeconfig: kubeconfig}
	dd.waitReady(t, d, addr)
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}

	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	pages = append([]string{filepath.Join(root, "README.md")}, pages...)
	ran := map[string]int{}
	for _, page := range pages {
		name, _ := filepath.Rel(root, page)
		lines, after := shellLines(t, page)
		for i, line := range lines {
			cmd, _, _ := strings.Cut(line, " #")
			cmd = strings.TrimSpace(optional.ReplaceAllString(cmd, ""))
			args := strings.Fields(cmd)
			for j, a := range args {
				// The pages run from the repository's top folder.
				if _, err := os.Stat(filepath.Join(root, a)); err == nil && j > 0 && !strings.HasPrefix(a, "/") && args[0] == "bin/metasync" {
					args[j] = filepath.Join(root, a)
				}
			}
			what := name + ": " + line
			if name == filepath.Join("docs", "clusters.md") && args[0] == "curl" {
				// The walk-through of make run CLUSTERS=2 asks two
				// clusters: hack/devcluster's TestClustersWalkThrough
				// runs these lines against make run's program.
				ran[name]++
				continue
			}
			switch {
			case args[0] == "make" && len(args) > 1:
				if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(args[1]) + `:`).Match(makefile) {
					t.Errorf("%s: the Makefile has no target %s", what, args[1])
				}
			case args[0] == "kubectl" && len(args) > 3 && args[1] == "apply" && args[2] == "-f":
				if _, err := os.Stat(filepath.Join(root, args[3])); err != nil {
					t.Errorf("%s: %v", what, err)
				}
			case strings.HasPrefix(args[0], "GRPC_XDS_BOOTSTRAP=") || strings.HasPrefix(cmd, "(cd examples/xds-node && "):
				// The xDS walk-through needs make run's gRPC servers:
				// hack/devcluster's TestXDSWalkThrough runs these lines.
				// Here: the programs they run exist.
				for _, a := range args {
					if strings.HasPrefix(a, "./examples/") || a == "client.js" {
						if a == "client.js" {
							a = "examples/xds-node/client.js"
						}
						if _, err := os.Stat(filepath.Join(root, a)); err != nil {
							t.Errorf("%s: %v", what, err)
						}
					}
				}
			case args[0] == "go" && len(args) > 2 && args[1] == "run":
				if _, err := os.Stat(filepath.Join(root, args[2])); err != nil {
					t.Errorf("%s: %v", what, err)
				}
			case args[0] == "go" && len(args) > 2 && args[1] == "test":
				goTestLine(t, root, what, args)
			case args[0] == "bin/metasync" && len(args) > 1 && dd.metasyncLine(t, what, cmd, args):
			case args[0] == "curl":
				dd.curlLine(t, what, args, after[i])
			default:
				t.Errorf("%s: no check of this line: add one to TestDocsShellBlocks", what)
				continue
			}
			ran[name]++
		}
	}
	t.Logf("lines checked per page: %v", ran)
	if ran["docs/daemon.md"] < 14 || ran["README.md"] < 7 || dd.asked < 12 {
		t.Errorf("lines checked per page: %v, %d get, indexes and version lines run; want every line of docs/daemon.md's and README.md's blocks", ran, dd.asked)
	}
}

// docsDaemon is the daemon that TestDocsShellBlocks runs the pages'
// lines against.
type docsDaemon struct {
	addr, kubeconfig string
	asked            int // get, indexes and version lines run against it
}

// waitReady waits until the daemon d on addr is ready.
func (dd *docsDaemon) waitReady(t *testing.T, d *daemon, addr string) {
	t.Helper()
	waitHTTP(t, d, addr)
	testenv.Eventually(t, "ready", func() string {
		if a := call(t, "GET", base(addr)+"/readyz"); a.code != 200 {
			return a.raw
		}
		return ""
	})
}

// metasyncLine checks a bin/metasync line (args; cmd as written, without
// its comment): serve, validate, get, indexes and version; false for
// another.
func (dd *docsDaemon) metasyncLine(t *testing.T, what, cmd string, args []string) bool {
	t.Helper()
	switch {
	case args[1] == "serve":
		flags := args[2:]
		for j := range flags {
			if j > 0 && flags[j-1] == "--snapshot-dir" {
				flags[j] = t.TempDir()
			}
		}
		other := testenv.FreeAddr(t)
		dd.waitReady(t, start(t, nil, append(flags, "--kubeconfig", dd.kubeconfig, "--listen", other)...), other)
	case args[1] == "validate":
		if out, errOut, code := metasync(t, args[1:]...); code != 0 {
			t.Errorf("%s = exit %d\n%s%s", what, code, out, errOut)
		}
	case args[1] == "get" || args[1] == "indexes" || args[1] == "version":
		args = args[1:]
		if len(args) > 1 && args[1] == "--help" {
			break // TestHelp
		}
		if args[0] != "version" {
			args = append(args, "--server", dd.addr)
		}
		dd.asked++
		if strings.Contains(cmd, "--watch") {
			lines := followCLI(t, args[1:]...)
			testenv.Eventually(t, what+": a first answer", func() string {
				if len(lines()) == 0 {
					return "nothing yet"
				}
				return ""
			})
			break
		}
		if out, errOut, code := metasync(t, args...); code != 0 || strings.TrimSpace(out) == "" || errOut != "" {
			t.Errorf("%s = exit %d\n%s%s", what, code, out, errOut)
		}
	default:
		return false
	}
	return true
}

// curlLine checks a curl line (args): 200, and the body that the line
// after it shows ("# {...}"), if it shows one; a stream (?watch=true) its
// snapshot frame.
func (dd *docsDaemon) curlLine(t *testing.T, what string, args []string, after string) {
	t.Helper()
	url := strings.Trim(args[len(args)-1], `'"`)
	url = strings.Replace(url, "127.0.0.1:8080", dd.addr, 1)
	if strings.Contains(url, "watch=true") {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		first, _ := bufio.NewReader(resp.Body).ReadString('\n')
		resp.Body.Close()
		var f struct{ Type string }
		if resp.StatusCode != 200 || json.Unmarshal([]byte(first), &f) != nil || f.Type != "snapshot" {
			t.Errorf("%s = %d, first frame %q", what, resp.StatusCode, first)
		}
		return
	}
	a := call(t, "GET", url)
	want, shown := strings.CutPrefix(after, "# {")
	if a.code != 200 || shown && strings.TrimSpace(a.raw) != "{"+want {
		t.Errorf("%s = %d %s, the page shows %s", what, a.code, a.raw, after)
	}
}

// goTestLine checks a page's go test line: its package folder exists,
// and the benchmark it names is one of that folder's tests.
func goTestLine(t *testing.T, root, what string, args []string) {
	t.Helper()
	dir, bench := "", ""
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "./"):
			dir = filepath.Join(root, a)
		case a == "-bench" && i+1 < len(args):
			bench = strings.Trim(args[i+1], "'^$")
		}
	}
	if dir == "" {
		t.Errorf("%s: no package folder", what)
		return
	}
	tests, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil || len(tests) == 0 {
		t.Errorf("%s: no tests in %s", what, dir)
		return
	}
	if bench == "" || bench == "." {
		return
	}
	for _, f := range tests {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), "func "+bench+"(") {
			return
		}
	}
	t.Errorf("%s: no func %s in %s", what, bench, dir)
}
