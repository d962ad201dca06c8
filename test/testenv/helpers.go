package testenv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Buffer is a bytes.Buffer that a process or many goroutines may write
// while a test reads it.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// FreeAddr returns a loopback address with a port nobody listens on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Resident is the resident memory of process pid (VmRSS), in bytes; 0
// when it cannot be read.
func Resident(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// ReferenceConfig is the reference setup's config
// (examples/appmodel/config.yaml) watching namespace ns instead of
// meta-test.
func ReferenceConfig(ns string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(Root(), "examples", "appmodel", "config.yaml"))
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(b, []byte("namespace: meta-test")) {
		return nil, fmt.Errorf("examples/appmodel/config.yaml watches no namespace meta-test")
	}
	return bytes.ReplaceAll(b, []byte("namespace: meta-test"), []byte("namespace: "+ns)), nil
}
