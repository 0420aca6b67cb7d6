// Package diskroom keeps gpucr from filling a file system with what input it does not
// trust asks it to write (an archive, a store's checkpoint): a few kilobytes can describe
// terabytes, and the file system may be another job's (/dev/shm is memory).
package diskroom

import (
	"fmt"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"
)

// Keep is how much of a file system of size bytes is left free: 5%, at most 1 GiB.
func Keep(size int64) int64 { return min(size/20, 1<<30) }

// Check refuses writing more bytes into the file system of dir when that would leave it
// with less than Keep free.
func Check(dir string, more int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("room in %s: %w", dir, err)
	}
	free, size := int64(st.Bavail)*st.Bsize, int64(st.Blocks)*st.Bsize
	if free-more < Keep(size) {
		return &FullError{Dir: dir, Need: more, Free: free, Keep: Keep(size)}
	}
	return nil
}

// FullError says that the file system of Dir has no room for Need more bytes.
type FullError struct {
	Dir              string
	Need, Free, Keep int64
}

func (e *FullError) Error() string {
	if e.Need == 0 {
		return fmt.Sprintf("the file system of %s is down to %s free, less than the %s kept for others", e.Dir, humanize.IBytes(uint64(max(e.Free, 0))), humanize.IBytes(uint64(e.Keep)))
	}
	return fmt.Sprintf("%s to write into %s, which has %s free and keeps %s for others", humanize.IBytes(uint64(e.Need)), e.Dir, humanize.IBytes(uint64(max(e.Free, 0))), humanize.IBytes(uint64(e.Keep)))
}
