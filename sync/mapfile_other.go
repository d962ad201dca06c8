//go:build !unix

package sync

import (
	"fmt"
	"os"
)

// mapFile reads a snapshot file; release does nothing. Only a regular
// file is read.
func mapFile(path string) ([]byte, func(), error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s: not a regular file (%s)", path, st.Mode().Type())
	}
	b, err := os.ReadFile(path)
	return b, func() {}, err
}
