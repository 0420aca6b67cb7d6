package proctree

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// kcmpFile is the kcmp(2) type comparing two descriptors' open files.
const kcmpFile = 0

// SameFile says whether descriptor fd of pid and descriptor fd2 of pid2 are one open file
// (kcmp): a child forked from a parent holds the parent's open files until either closes
// them, where a file either opened itself is another, whatever its path.
func SameFile(pid, fd, pid2, fd2 int) (bool, error) {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pid), uintptr(pid2), kcmpFile, uintptr(fd), uintptr(fd2), 0)
	if errno != 0 {
		return false, fmt.Errorf("compare descriptor %d of pid %d with %d of pid %d: %w", fd, pid, fd2, pid2, errno)
	}
	return r == 0, nil
}

// Descriptors lists pid's descriptors whose paths want is true of, by number: none for a
// process gone; those closed while they are read are left out.
func (s *Snapshot) Descriptors(pid int, want func(path string) bool) map[int]string {
	dir := filepath.Join(s.root, strconv.Itoa(pid), "fd")
	entries, _ := os.ReadDir(dir)
	out := map[int]string{}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if path, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && want(path) {
			out[fd] = path
		}
	}
	return out
}
