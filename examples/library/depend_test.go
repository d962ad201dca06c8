package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDependByReplace: the steps of docs/library.md ("Depend on it before
// a release"), as written, make a new module that imports metasync from
// a checkout build. The checkout is this repository; metasync's go.sum
// comes along so that no checksum is asked of the network.
func TestDependByReplace(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "library.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(page), "## Depend on it before a release\n")
	if !ok {
		t.Fatal(`docs/library.md has no "Depend on it before a release"`)
	}
	_, rest, _ = strings.Cut(rest, "```\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/library.md: no block of commands")
	}
	var steps []string
	for _, l := range strings.Split(strings.TrimSpace(block), "\n") {
		steps = append(steps, strings.TrimSpace(l))
	}
	if len(steps) != 3 || !strings.HasPrefix(steps[0], "go mod edit -replace=github.com/iidp/metasync=../metasync") {
		t.Fatalf("the page's steps are %q: adapt the test", steps)
	}

	dir := t.TempDir()
	app := filepath.Join(dir, "app")
	// The checkout beside the module, as the page has it.
	if err := os.Symlink(root, filepath.Join(dir, "metasync")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(app, 0o755); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := "1.26"
	files := map[string]string{
		"go.mod": "module example.com/app\n\ngo " + goVersion + "\n",
		"go.sum": string(sum),
		"main.go": `package main

import (
	"fmt"

	"github.com/iidp/metasync/schema"
)

func main() { fmt.Println(schema.DefaultListen) }
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(app, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range steps {
		args := strings.Fields(step)
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = app
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", step, err, out)
		}
	}
	mod, _ := os.ReadFile(filepath.Join(app, "go.mod"))
	if !strings.Contains(string(mod), "github.com/iidp/metasync v0.0.0-00010101000000-000000000000") {
		t.Errorf("go.mod after the steps:\n%s", mod)
	}
	run := exec.Command("go", "run", ".")
	run.Dir = app
	run.Env = append(os.Environ(), "GOWORK=off")
	if out, err := run.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "127.0.0.1:8080" {
		t.Errorf("go run . = %v\n%s", err, out)
	}
}
