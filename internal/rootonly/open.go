package rootonly

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// OpenDir opens the directory at the absolute path abs as Symlinks checks it, every symlink
// on the way root's, in one walk that holds what it reached: each name is opened in the
// directory held before it and each symlink is read through a descriptor of its own. A
// check of the path followed by an open by name let a user who swapped a directory of
// theirs for a symlink, and back, between the two send root's open to a directory of root's
// (review). It returns an O_PATH descriptor for the caller to close.
func OpenDir(abs string) (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: "/", Err: err}
	}
	rest, links := strings.Split(abs, "/"), 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		if name == "" || name == "." {
			continue
		}
		next, link, err := openName(fd, name)
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: %w", abs, err)
		}
		if link == "" {
			unix.Close(fd)
			fd = next
			continue
		}
		if links++; links > maxLinks {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: too many levels of symbolic links", abs)
		}
		if strings.HasPrefix(link, "/") {
			unix.Close(fd)
			if fd, err = unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
				return -1, &os.PathError{Op: "open", Path: "/", Err: err}
			}
		}
		rest = append(strings.Split(link, "/"), rest...)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		if err == nil {
			err = unix.ENOTDIR
		}
		return -1, &os.PathError{Op: "open", Path: abs, Err: err}
	}
	return fd, nil
}

// openName opens name in the directory dirfd without following it. A symlink is not kept
// open: its target is returned instead, once the link, read through its own descriptor, is
// found to be root's (ErrUserSymlink otherwise).
func openName(dirfd int, name string) (fd int, link string, err error) {
	fd, err = unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", &os.PathError{Op: "open", Path: name, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, "", &os.PathError{Op: "stat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return fd, "", nil
	}
	defer unix.Close(fd)
	if st.Uid != 0 {
		return -1, "", fmt.Errorf("%s is a %w", name, ErrUserSymlink)
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return -1, "", &os.PathError{Op: "readlink", Path: name, Err: err}
	}
	return -1, string(buf[:n]), nil
}
