package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestCgroupMemoryLimit(t *testing.T) {
	for name, c := range map[string]struct {
		files map[string]string
		want  int64
	}{
		"v2 limit":     {map[string]string{"memory.max": "536870912\n"}, 536870912},
		"v2 unlimited": {map[string]string{"memory.max": "max\n"}, 0},
		"v1 limit":     {map[string]string{"memory/memory.limit_in_bytes": "268435456\n"}, 268435456},
		"v1 unlimited": {map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		"none":         {nil, 0},
		"garbage":      {map[string]string{"memory.max": "lots"}, 0},
		"tiny":         {map[string]string{"memory.max": "1"}, 1},
	} {
		root := t.TempDir()
		for p, content := range c.files {
			_ = os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
			if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got, _ := cgroupMemoryLimit(root); got != c.want {
			t.Errorf("%s: %d, want %d", name, got, c.want)
		}
	}
}

func TestSetMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "memory.max"), []byte("1000000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOMEMLIMIT", "")
	os.Unsetenv("GOMEMLIMIT")
	debug.SetMemoryLimit(1 << 62)
	if err := setMemoryLimit("auto", root, log); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != 900000000 {
		t.Errorf("auto: %d, want 90 %% of the cgroup's", got)
	}
	if err := setMemoryLimit("300Mi", root, log); err != nil || debug.SetMemoryLimit(-1) != 300<<20 {
		t.Errorf("300Mi: %v, %d", err, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(1 << 62)
	if err := setMemoryLimit("off", root, log); err != nil || debug.SetMemoryLimit(-1) != 1<<62 {
		t.Errorf("off changed the limit")
	}
	if err := os.WriteFile(filepath.Join(root, "memory.max"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	debug.SetMemoryLimit(1 << 62)
	if err := setMemoryLimit("auto", root, log); err != nil || debug.SetMemoryLimit(-1) != 1<<62 {
		t.Errorf("auto with a 1-byte cgroup limit set the runtime's")
	}
	t.Setenv("GOMEMLIMIT", "200MiB")
	if err := setMemoryLimit("auto", root, log); err != nil || debug.SetMemoryLimit(-1) != 1<<62 {
		t.Errorf("auto with GOMEMLIMIT set changed the limit")
	}
	for _, bad := range []string{"lots", "-1Mi", "0", "400m", "0.5", "1k", "100E", "1e30"} {
		if err := setMemoryLimit(bad, root, log); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
