//go:build unix

package sync

import (
	"os"
	"syscall"
)

// mapFile maps a snapshot file read-only: its pages come from the page
// cache as they are read, without a copy into fresh memory (which costs
// a page fault per 4 KiB). release unmaps it: nothing may read it after.
// The file is replaced by a rename, never changed in place, so the mapping
// stays valid; a file truncated by someone else meanwhile would fault.
func mapFile(path string) (data []byte, release func(), err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	size := st.Size()
	if size == 0 || size != int64(int(size)) {
		b, err := os.ReadFile(path)
		return b, func() {}, err
	}
	data, err = syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		b, err := os.ReadFile(path)
		return b, func() {}, err
	}
	return data, func() { _ = syscall.Munmap(data) }, nil
}
