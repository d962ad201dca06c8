//go:build unix

package sync

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps a snapshot file read-only: its pages come from the page
// cache as they are read, without a copy into fresh memory (which costs
// a page fault per 4 KiB). release unmaps it: nothing may read it after.
// The file is replaced by a rename, never changed in place, so the mapping
// stays valid; a file truncated by someone else meanwhile would fault.
//
// Only a regular file is read: it is opened without blocking (a FIFO
// would wait for a writer) and anything else (a FIFO, a device such as
// /dev/zero, a folder) is refused.
func mapFile(path string) (data []byte, release func(), err error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s: not a regular file (%s)", path, st.Mode().Type())
	}
	size := st.Size()
	if size == 0 {
		return nil, func() {}, nil
	}
	if size != int64(int(size)) {
		return nil, nil, fmt.Errorf("%s: %d bytes, too large to map", path, size)
	}
	data, err = syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		return nil, nil, fmt.Errorf("map %s: %w", path, err)
	}
	return data, func() { _ = syscall.Munmap(data) }, nil
}
