// Package configfile reads the config and CRD files that metasync is
// given: regular files of bounded size, so that a path that points at a
// device or a pipe fails at once instead of blocking or filling memory.
package configfile

import (
	"fmt"
	"io"
	"os"
)

// MaxBytes bounds the config and CRD files metasync reads: no config
// comes near it, and a path that points at a device or an endless stream
// fails with an error instead of filling memory.
const MaxBytes = 16 << 20

// Read reads a config or CRD file: a regular file (a FIFO, a device such
// as /dev/zero or a folder is refused before it is opened, so that the
// read neither blocks nor grows without end) of at most MaxBytes.
func Read(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, st.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("%s: larger than %d MiB", path, MaxBytes>>20)
	}
	return b, nil
}
