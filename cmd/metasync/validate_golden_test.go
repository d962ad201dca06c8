package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/validate/*.want from what validate prints")

// TestValidateGolden runs `metasync validate` on each config of
// testdata/validate and compares its exit code, stdout and stderr with the
// config's .want file (go test -run TestValidateGolden -update rewrites
// them; read the difference before committing it).
func TestValidateGolden(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "validate", "*.yaml"))
	if len(files) == 0 {
		t.Fatal("no configs in testdata/validate")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			out, errOut, code := cli("validate", file)
			got := fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", code, out, errOut)
			wantFile := strings.TrimSuffix(file, ".yaml") + ".want"
			if *update {
				if err := os.WriteFile(wantFile, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(wantFile)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("validate %s:\n%s\nwant (%s):\n%s", file, got, wantFile, want)
			}
		})
	}
}
