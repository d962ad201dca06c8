package schema

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad: any file content either loads into a config that compiles, or
// fails with problems; never a panic.
func FuzzLoad(f *testing.F) {
	for _, name := range []string{"good.yaml", "five-mistakes.bad.yaml", "shapes.bad.yaml", "resync-number.bad.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("resources: {}"))
	f.Add([]byte("resources:\n- name: a\n  fields: {a.b: x}\n"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path, LoadOptions{Environ: []string{"METASYNC_LISTEN=127.0.0.1:1"}})
		if err != nil {
			if len(Problems(err)) == 0 {
				t.Fatalf("an error without problems: %v", err)
			}
			return
		}
		if _, err := Compile(c); err != nil {
			t.Fatalf("Load accepted what Compile refuses: %v", err)
		}
	})
}
