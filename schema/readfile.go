package schema

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// MaxFileBytes bounds the config and CRD files metasync reads: no config
// comes near it, and a path that points at a device or an endless stream
// fails with an error instead of filling memory.
const MaxFileBytes = 16 << 20

// ReadFile reads a config or CRD file: a regular file (a FIFO, a device
// such as /dev/zero or a folder is refused before it is opened, so that
// the read neither blocks nor grows without end) of at most MaxFileBytes.
func ReadFile(path string) ([]byte, error) {
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
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d MiB", path, MaxFileBytes>>20)
	}
	return b, nil
}

// bytesProvider gives koanf a file already read.
type bytesProvider []byte

func (b bytesProvider) ReadBytes() ([]byte, error) { return b, nil }

func (bytesProvider) Read() (map[string]any, error) {
	return nil, errors.New("bytesProvider gives bytes only")
}
