package configfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadRefusesWhatIsNoRegularFile(t *testing.T) {
	for _, path := range []string{"/dev/zero", t.TempDir()} {
		if _, err := Read(path); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Read(%s) = %v, want a refusal", path, err)
		}
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(big); err == nil || !strings.Contains(err.Error(), "larger than 16 MiB") {
		t.Errorf("Read of %d bytes = %v", MaxBytes+1, err)
	}
}
