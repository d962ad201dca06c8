package schema

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadRefusesWhatIsNoRegularFile: a device, a folder or a file over
// 16 MiB at the config's path is refused, not read.
func TestLoadRefusesWhatIsNoRegularFile(t *testing.T) {
	for _, path := range []string{"/dev/zero", t.TempDir()} {
		if _, err := Load(path, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Load(%s) = %v, want a refusal", path, err)
		}
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, 16<<20+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "larger than 16 MiB") {
		t.Errorf("Load of %d bytes = %v", 16<<20+1, err)
	}
}
