package chunked

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/beneath"
)

// heldFiles are an image's files held open from before they are verified until their last
// byte is uploaded, so that what a push stores is what it verified: whoever can write the
// image may swap a file for another, or write into it, between the two reads (a hostile
// test had a push report a checkpoint that never pulled back so).
type heldFiles struct {
	paths []string // slash-separated, relative to the image directory
	files []*os.File
	ids   []fileID // as each was when opened
}

// fileID is what tells one file and whether it changed: its device and inode, its size and
// its change time, which every write to it and every rename of it moves on.
type fileID struct {
	dev, ino uint64
	size     int64
	ctime    unix.Timespec
}

func idOf(f *os.File) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, ctime: st.Ctim}, nil
}

// holdFiles opens paths in dir, not through a symlink nor waiting on a FIFO.
func holdFiles(dir string, paths []string) (*heldFiles, error) {
	h := &heldFiles{paths: paths}
	for _, rel := range paths {
		f, err := beneath.Open(dir, filepath.FromSlash(rel))
		if err != nil {
			h.close()
			return nil, fmt.Errorf("push %s: %w", dir, err)
		}
		h.files = append(h.files, f)
		id, err := idOf(f)
		if err != nil {
			h.close()
			return nil, fmt.Errorf("push %s: %w", dir, err)
		}
		h.ids = append(h.ids, id)
	}
	return h, nil
}

// unchanged fails unless each held file of those checked names is still the file at its
// path in dir, and unchanged since it was opened: what was read through the path since
// (loaded, verified) is then what the held file holds.
func (h *heldFiles) unchanged(dir string, checked func(path string) bool) error {
	for i, f := range h.files {
		if !checked(h.paths[i]) {
			continue
		}
		now, err := idOf(f)
		if err != nil {
			return fmt.Errorf("push %s: %w", dir, err)
		}
		var st unix.Stat_t
		err = unix.Lstat(filepath.Join(dir, filepath.FromSlash(h.paths[i])), &st)
		if now != h.ids[i] || err != nil || st.Dev != now.dev || st.Ino != now.ino {
			return fmt.Errorf("push %s: %w", dir, &changedError{h.paths[i]})
		}
	}
	return nil
}

// changedError is an image file that changed, or was replaced, while it was pushed.
type changedError struct{ path string }

func (e *changedError) Error() string {
	return fmt.Sprintf("%s changed while it was pushed: push the image again once nothing writes it", e.path)
}

func (h *heldFiles) close() {
	for _, f := range h.files {
		f.Close()
	}
}
