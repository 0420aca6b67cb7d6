package beneath

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/crashpoint"
)

// ReplaceSuffix names the file Replace writes before it renames it over its target; one
// an interrupted Replace left is removed by the next.
const ReplaceSuffix = ".new"

// Dir is a directory held open, whose entries are read, created, renamed and removed by
// name through it: a directory that others can write may swap a name for a symlink at
// any moment, and gpucr, as root, must neither write nor read through one.
type Dir struct {
	fd   int
	path string
}

// ErrSymlinkInPath means a path given to OpenDir goes through a symlink.
var ErrSymlinkInPath = errors.New("a symlink is on the way")

// OpenDir holds the directory at path, which must have no symlink anywhere in it, its
// last part included: whoever can write a directory on the way could otherwise point it
// at a directory of someone else's.
func OpenDir(path string) (*Dir, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, abs, &unix.OpenHow{
		Flags:   unix.O_DIRECTORY | unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ELOOP) {
		err = ErrSymlinkInPath
		if real, rerr := filepath.EvalSymlinks(abs); rerr == nil {
			err = fmt.Errorf("%w: give the directory's own path, %s", ErrSymlinkInPath, real)
		}
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{fd: fd, path: path}, nil
}

// OpenDirAll holds the directory at path as OpenDir does, making it first, and any parent
// missing (mode perm), each by name in the one above it, held: a symlink put on the way
// while they are made is refused as one already there is.
func OpenDirAll(path string, perm uint32) (*Dir, error) {
	d, err := OpenDir(path)
	if !errors.Is(err, unix.ENOENT) {
		return d, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	parent, name := filepath.Dir(abs), filepath.Base(abs)
	if parent == abs {
		return nil, &os.PathError{Op: "open", Path: path, Err: unix.ENOENT}
	}
	up, err := OpenDirAll(parent, perm)
	if err != nil {
		return nil, err
	}
	defer up.Close()
	if err := unix.Mkdirat(up.fd, name, perm); err != nil && err != unix.EEXIST {
		return nil, up.err("mkdir", name, err)
	}
	fd, err := unix.Openat2(up.fd, name, &unix.OpenHow{
		Flags:   unix.O_DIRECTORY | unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		err = ErrSymlinkInPath
	}
	if err != nil {
		return nil, up.err("open", name, err)
	}
	return &Dir{fd: fd, path: filepath.Join(up.path, name)}, nil
}

// Is says whether path names the directory d holds, now.
func (d *Dir) Is(path string) bool {
	var held, named unix.Stat_t
	return unix.Fstat(d.fd, &held) == nil && unix.Stat(path, &named) == nil &&
		held.Dev == named.Dev && held.Ino == named.Ino
}

// Within is a path that names the held directory whatever happens to its own path
// meanwhile (its /proc/self/fd link, with a trailing slash so that a walk starts inside
// it): reads through it cannot be sent to another directory by a rename between them.
func (d *Dir) Within() string { return fmt.Sprintf("/proc/self/fd/%d/", d.fd) }

// Close lets the directory go.
func (d *Dir) Close() error { return unix.Close(d.fd) }

// ReadFile reads the regular file name in d as ReadFile does.
func (d *Dir) ReadFile(name string, limit int64) ([]byte, error) {
	f, err := openRegular(d.fd, d.path, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readLimited(f, limit)
}

// Replace puts b in place of the file name in d, atomically and durably: written to a new
// file beside it (created, never opened if it exists, so no symlink is followed), synced,
// renamed over name, and the directory synced.
func (d *Dir) Replace(name string, b []byte) error {
	tmp := name + ReplaceSuffix
	_ = unix.Unlinkat(d.fd, tmp, 0) // an interrupted Replace's; unlink removes a symlink, not its target
	fd, err := unix.Openat(d.fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return d.err("create", tmp, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.path, tmp))
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		crashpoint.Hit("replace " + name + ": written aside")
		err = d.rename(tmp, name)
	}
	if err != nil {
		_ = unix.Unlinkat(d.fd, tmp, 0)
		return err
	}
	return d.Sync()
}

// Open opens the regular file name in d for reading, as Open does.
func (d *Dir) Open(name string) (*os.File, error) { return openRegular(d.fd, d.path, name) }

// CreateTemp creates a new file in d named prefix and a random suffix, open for writing: a
// name that exists, a symlink included, is never opened.
func (d *Dir) CreateTemp(prefix string) (*os.File, string, error) {
	for range 100 {
		name := prefix + strconv.FormatUint(rand.Uint64(), 36)
		fd, err := unix.Openat(d.fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == unix.EEXIST {
			continue
		}
		if err != nil {
			return nil, "", d.err("create", name, err)
		}
		return os.NewFile(uintptr(fd), filepath.Join(d.path, name)), name, nil
	}
	return nil, "", d.err("create", prefix+"*", unix.EEXIST)
}

// Link gives the file from in d the name to as well, failing with fs.ErrExist if to is
// taken: of two writers linking one name, one wins.
func (d *Dir) Link(from, to string) error {
	if err := unix.Linkat(d.fd, from, d.fd, to, 0); err != nil {
		return d.err("link", to, err)
	}
	return nil
}

// LinkFile gives the file f, held open, the name to in d as well, failing with
// fs.ErrExist if to is taken: the file linked is the one checked through f, whatever its
// name was swapped for since (a symlink included). It needs CAP_DAC_READ_SEARCH (root).
func (d *Dir) LinkFile(f *os.File, to string) error {
	if err := unix.Linkat(int(f.Fd()), "", d.fd, to, unix.AT_EMPTY_PATH); err != nil {
		return d.err("link", to, err)
	}
	return nil
}

// Rename renames from to to in d, replacing what to names (a symlink itself, never its
// target).
func (d *Dir) Rename(from, to string) error { return d.rename(from, to) }

// Lstat is what name in d is, a symlink itself, looked up through the held directory.
func (d *Dir) Lstat(name string) (os.FileInfo, error) {
	fi, err := os.Lstat(filepath.Join(d.Within(), name))
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, d.err("lstat", name, err)
	}
	return fi, nil
}

// Entries lists what d holds, each as Lstat says it is; an entry gone since the listing is
// left out.
func (d *Dir) Entries() ([]os.FileInfo, error) {
	fd, err := unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, d.err("open", ".", err)
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, d.err("list", ".", err)
	}
	var out []os.FileInfo
	for _, name := range names {
		if fi, err := d.Lstat(name); err == nil {
			out = append(out, fi)
		}
	}
	return out, nil
}

// Remove removes the entry name from d (a symlink itself, never its target); a missing
// one is not an error.
func (d *Dir) Remove(name string) error {
	if err := unix.Unlinkat(d.fd, name, 0); err != nil && err != unix.ENOENT {
		return d.err("remove", name, err)
	}
	return nil
}

// Sync makes d's entries durable.
func (d *Dir) Sync() error {
	fd, err := unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return d.err("open", ".", err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return d.err("sync", ".", err)
	}
	return nil
}

func (d *Dir) rename(from, to string) error {
	if err := unix.Renameat(d.fd, from, d.fd, to); err != nil {
		return d.err("rename", from, err)
	}
	return nil
}

func (d *Dir) err(op, name string, err error) error {
	return &os.PathError{Op: op, Path: filepath.Join(d.path, name), Err: err}
}
