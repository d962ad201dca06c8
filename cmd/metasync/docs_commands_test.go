package main_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/internal/testenv"
)

// TestDaemonDocsCommands runs the `bin/metasync get`, `indexes` and
// `version` lines of docs/daemon.md's first block, as written, against a
// daemon serving examples/appmodel on its sample objects (the address
// given after the arguments, which the CLI takes), and checks that each
// answers: exit 0, something on stdout, nothing on stderr. `--watch`
// lines are run until their first answer.
func TestDaemonDocsCommands(t *testing.T) {
	testenv.Need(t, env)
	root := testenv.Root()
	env.InstallCRDFile(t, filepath.Join(root, "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, "meta-test")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, filepath.Join(root, "examples", "appmodel", "samples.yaml"), filepath.Join(root, "examples", "appmodel", "routing.yaml")); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	d := start(t, nil, "--config", filepath.Join(root, "examples", "appmodel", "config.yaml"), "--kubeconfig", env.WriteKubeconfig(t, ""), "--listen", addr)
	waitHTTP(t, d, addr)
	testenv.Eventually(t, "ready", func() string {
		if a := call(t, "GET", base(addr)+"/readyz"); a.code != 200 {
			return a.raw
		}
		return ""
	})
	ran := 0
	for _, line := range readmeSteps(t, filepath.Join(root, "docs", "daemon.md")) {
		cmd, _, _ := strings.Cut(line, "#")
		args := strings.Fields(cmd)
		if len(args) < 2 || args[0] != "bin/metasync" || (args[1] != "get" && args[1] != "indexes" && args[1] != "version") {
			continue
		}
		args = args[1:]
		if len(args) > 1 && args[1] == "--help" {
			continue // TestHelp
		}
		if args[0] != "version" {
			args = append(args, "--server", addr)
		}
		ran++
		if strings.Contains(cmd, "--watch") {
			lines := followCLI(t, args[1:]...)
			testenv.Eventually(t, line+": a first answer", func() string {
				if len(lines()) == 0 {
					return "nothing yet"
				}
				return ""
			})
			continue
		}
		out, errOut, code := metasync(t, args...)
		if code != 0 || strings.TrimSpace(out) == "" || errOut != "" {
			t.Errorf("%s = exit %d\n%s%s", line, code, out, errOut)
		}
	}
	if ran < 8 {
		t.Errorf("ran %d commands of docs/daemon.md, want its get, indexes and version lines", ran)
	}
}
