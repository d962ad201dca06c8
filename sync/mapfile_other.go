//go:build !unix

package sync

import "os"

// mapFile reads a snapshot file; release does nothing.
func mapFile(path string) ([]byte, func(), error) {
	b, err := os.ReadFile(path)
	return b, func() {}, err
}
