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
	if err := setMemoryLimit("0.5Gi", root, log); err != nil || debug.SetMemoryLimit(-1) != 512<<20 {
		t.Errorf("0.5Gi: %v, %d; want 512Mi", err, debug.SetMemoryLimit(-1))
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
	for _, bad := range []string{"lots", "-1Mi", "0", "400m", "0.5", "1k", "100E", "1e30", "10E", "9223372036854775808",
		"0.1Gi", "15.9Mi", "1.5Mi", "0.5Ki"} {
		if err := setMemoryLimit(bad, root, log); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestParseMemoryLimit: the quantities a container's memory limit is
// written in, decimal fractions of binary units included, as
// resource.Quantity reads them; never a fraction of a byte, a value that
// overflows, or one under 16Mi.
func TestParseMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{
		"0.5Gi":               512 << 20,
		"512Mi":               512 << 20,
		"1.5Gi":               3 << 29,
		"1.000Gi":             1 << 30,
		"16.5Mi":              16<<20 + 512<<10,
		"16Mi":                16 << 20,
		"0.25Ti":              1 << 38,
		"1G":                  1e9,
		"1.5e9":               1.5e9,
		"400M":                400e6,
		"8E":                  8e18,
		"9223372036854775807": 1<<63 - 1,
	} {
		got, err := parseMemoryLimit(in)
		if err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
	for in, reason := range map[string]string{
		"lots":                "not a quantity",
		"-1Gi":                "not a positive quantity",
		"0":                   "not a positive quantity",
		"400m":                "a fraction of a byte",
		"0.1Gi":               "a fraction of a byte",
		"0.0005Ti":            "a fraction of a byte",
		"1k":                  "under 16Mi",
		"15.5Mi":              "under 16Mi",
		"10E":                 "too large",
		"9223372036854775808": "too large",
		"1e30":                "too large",
	} {
		if got, err := parseMemoryLimit(in); err == nil || err.Error() != reason {
			t.Errorf("%q: %d, %v; want the error %q", in, got, err, reason)
		}
	}
}
