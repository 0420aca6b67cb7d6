// Package beneath works on a directory tree without ever leaving it: no symlink followed,
// no mount point crossed (bind mounts included), whatever the tree's contents. gpucr runs as
// root on paths that others (CRIU, a container runtime, an image's author) filled.
package beneath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrMount means a removal met a mount point and left it, with what is beneath it.
var ErrMount = errors.New("a mount point is in the way")

const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_MAGICLINKS

// RemoveAll removes path and everything beneath it, like os.RemoveAll, but never descends
// through a mount point (a recursive bind of a container's root file system, left by a
// runtime killed halfway, would otherwise be emptied): one found fails the removal with
// ErrMount and is left whole. A missing path is not an error.
func RemoveAll(path string) error {
	parent, err := unix.Open(filepath.Dir(path), unix.O_DIRECTORY|unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("open %s: %w", filepath.Dir(path), err)
	}
	defer unix.Close(parent)
	return removeAt(parent, filepath.Base(path), path)
}

// removeAt removes name in directory dir (shown as full in errors).
func removeAt(dir int, name, full string) error {
	err := unix.Unlinkat(dir, name, 0)
	switch {
	case err == nil || errors.Is(err, unix.ENOENT):
		return nil
	case !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM):
		return fmt.Errorf("remove %s: %w", full, err)
	}
	fd, err := unix.Openat2(dir, name, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolve})
	switch {
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("remove %s: %w", full, ErrMount)
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return fmt.Errorf("open %s: %w", full, err)
	}
	d := os.NewFile(uintptr(fd), full)
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return fmt.Errorf("read %s: %w", full, err)
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, removeAt(fd, n, filepath.Join(full, n)))
	}
	d.Close()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := unix.Unlinkat(dir, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("remove %s: %w", full, ErrMount)
		}
		return fmt.Errorf("remove %s: %w", full, err)
	}
	return nil
}

// Open opens rel, a path inside dir, for reading, refusing a symlink anywhere on the way,
// a ".." that leaves dir, a mount crossed, and anything but a regular file: a file an
// image lists is read from the image and nowhere else, and a FIFO put in its place must
// not hang gpucr in open(2).
func Open(dir, rel string) (*os.File, error) {
	d, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(d)
	return openRegular(d, dir, rel)
}

// ReadFile reads rel, a regular file inside dir opened as Open opens it, refusing one of
// more than limit bytes: whoever wrote it must not make gpucr fill its memory.
func ReadFile(dir, rel string, limit int64) ([]byte, error) {
	f, err := Open(dir, rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readLimited(f, limit)
}

// ReadFileAt is ReadFile in the directory held open as dirfd, named dir in errors: for a
// directory reached by a walk that checked each step as it went (rootonly.OpenDir).
func ReadFileAt(dirfd int, dir, rel string, limit int64) ([]byte, error) {
	f, err := openRegular(dirfd, dir, rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readLimited(f, limit)
}

// readLimited reads all of f, a regular file, unless it is larger than limit bytes.
func readLimited(f *os.File, limit int64) ([]byte, error) {
	fi, err := f.Stat()
	switch {
	case err != nil:
		return nil, err
	case fi.Size() > limit:
		return nil, &os.PathError{Op: "read", Path: f.Name(), Err: fmt.Errorf("%d bytes, more than %d", fi.Size(), limit)}
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, err
	}
	return b, nil
}

// ErrNotRegular means a path that must be a regular file is something else (a FIFO, a
// device, a directory).
var ErrNotRegular = errors.New("not a regular file")

// openRegular opens rel beneath the directory dirfd (named dir in errors) as Open does.
// The open does not block (a FIFO would wait for a writer), and the file is checked to be
// regular before anything reads it.
func openRegular(dirfd int, dir, rel string) (*os.File, error) {
	full := filepath.Join(dir, rel)
	fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolve})
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			err = fmt.Errorf("%w: a symlink or mount leads out of %s", err, dir)
		}
		return nil, &os.PathError{Op: "open", Path: full, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: full, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, &os.PathError{Op: "open", Path: full, Err: ErrNotRegular}
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "open", Path: full, Err: err}
	}
	return os.NewFile(uintptr(fd), full), nil
}

// FS is the files of the directory it names, as an fs.FS: each file opened as Open opens
// it (regular, no symlink on the way, no FIFO waited on), the directory itself listed. For
// readers of image files written by others (CRIU's, an image's logs).
type FS string

func (d FS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	return Open(string(d), name)
}

// ReadDir lists the directory itself only ("."): its readers read one level of files, and
// a subdirectory listed by path could be a symlink leading out of it (review).
func (d FS) ReadDir(name string) ([]fs.DirEntry, error) {
	if name != "." {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrInvalid}
	}
	return os.ReadDir(string(d))
}
