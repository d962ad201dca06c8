package schema

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadFileRefusesWhatIsNoRegularFile(t *testing.T) {
	for _, path := range []string{"/dev/zero", t.TempDir()} {
		if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("ReadFile(%s) = %v, want a refusal", path, err)
		}
		if _, err := Load(path, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Load(%s) = %v, want a refusal", path, err)
		}
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(big); err == nil || !strings.Contains(err.Error(), "larger than 16 MiB") {
		t.Errorf("ReadFile of %d bytes = %v", MaxFileBytes+1, err)
	}
}
