package memfill

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// A Reserve holds tmpfs memory allocated ahead for a Save, while the driver stages device
// memory and gpucr's cores are idle. Into a tmpfs file that holds no page yet, the save's
// writes pay for allocating a page per 4 KiB (two thirds of its CPU time on the H100
// machine); into pages allocated ahead they only copy. A Reserve is files of maxSegment
// bytes under the image directory, each handed whole to a segment of the save and cut to
// its size; what no segment takes is removed.
type Reserve struct {
	dir   string // the files, out of the image's own directories
	stop  atomic.Bool
	wg    sync.WaitGroup
	mu    sync.Mutex
	ready []string // allocated, not yet taken; what is allocated after take is left to Release
}

// reserveDir is where a Reserve allocates, in the image directory.
const reserveDir = ".gpucr-reserve"

// ReserveFor starts allocating, in the background, about bytes of memory for a Save into
// imageDir, when imageDir is on a tmpfs (a disk's blocks gain nothing from it). It returns
// nil where it allocates nothing; a nil Reserve is an empty one.
func ReserveFor(imageDir string, bytes int64) *Reserve {
	var fs unix.Statfs_t
	if bytes < maxSegment || unix.Statfs(imageDir, &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		return nil
	}
	r := &Reserve{dir: filepath.Join(imageDir, reserveDir)}
	if os.Mkdir(r.dir, 0o700) != nil {
		return nil
	}
	n := int((bytes + maxSegment - 1) / maxSegment)
	var next atomic.Int64
	// Half the cores: the driver's staging runs meanwhile, and it is what the workload waits for.
	for range min(max(runtime.GOMAXPROCS(0)/2, 1), n) {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for i := int(next.Add(1)) - 1; i < n && !r.stop.Load(); i = int(next.Add(1)) - 1 {
				path := filepath.Join(r.dir, fmt.Sprint(i))
				if err := allocate(path); err != nil {
					os.Remove(path)
					r.stop.Store(true) // the tmpfs is full: the save will say so itself
					return
				}
				r.mu.Lock()
				r.ready = append(r.ready, path)
				r.mu.Unlock()
			}
		}()
	}
	return r
}

func allocate(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, maxSegment)
	return errors.Join(err, f.Close())
}

// take hands out the files allocated so far, once; allocation stops, so that it does not
// take cores from the save.
func (r *Reserve) take() []string {
	if r == nil {
		return nil
	}
	r.stop.Store(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.ready
	r.ready = nil
	return out
}

// Release stops the allocation and removes what no save took.
func (r *Reserve) Release() error {
	if r == nil {
		return nil
	}
	r.stop.Store(true)
	r.wg.Wait()
	if err := os.RemoveAll(r.dir); err != nil {
		return fmt.Errorf("memory save: remove reserved memory: %w", err)
	}
	return nil
}

// place makes a file of size bytes at path from one of files, a reserve's, if any is left
// (it is cut to size; true), else an empty one (false).
func place(files *[]string, path string, size int64) (bool, error) {
	if n := len(*files); n > 0 && size <= maxSegment {
		from := (*files)[n-1]
		*files = (*files)[:n-1]
		if err := os.Rename(from, path); err == nil {
			return true, os.Truncate(path, size)
		}
	}
	return false, createSized(path, size)
}
