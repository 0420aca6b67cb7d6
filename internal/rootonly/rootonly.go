// Package rootonly tells whether only root can change a file or a path: gpucr runs as root
// what it installed, and restores what it checked, only where no user could have swapped it.
package rootonly

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Mode says why fi (at path) could be changed by others than root: not root's, or writable
// by its group or others. nil means only root can.
func Mode(path string, fi fs.FileInfo) error {
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 {
		return fmt.Errorf("%s is not owned by root", path)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by users other than root (mode %v)", path, fi.Mode().Perm())
	}
	return nil
}

// Walk checks that path and every directory the kernel passes through to reach it belong
// to root and are writable by no one else, a root-owned sticky directory (as /tmp)
// excepted: there others cannot rename or remove what root owns. Symlinks on the way are
// followed one component at a time, as the kernel does, and each must be root's: a symlink
// is replaced by whoever may write the directory that holds it (its owner, in a sticky
// one), so a user's symlink that points at root's directory today can point at theirs
// while root writes through it (a hostile test).
func Walk(path string) error {
	abs := path
	if !filepath.IsAbs(path) {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		abs = wd + "/" + path
	}
	return walk(abs, check) // not cleaned first: a ".." after a symlink leaves where the link led
}

// Strict is Walk with no exception for path itself: in a root-owned sticky directory that
// all may write (/tmp), others cannot touch what root put there, but they may still add
// files of their own, which a reader of the whole directory would take for root's.
func Strict(path string) error {
	if err := Walk(path); err != nil {
		return err
	}
	fi, err := os.Stat(path) // every symlink on the way is root's: Walk checked them
	if err != nil {
		return err
	}
	return Mode(path, fi)
}

// ErrUserSymlink is a symlink on the way to a path that someone other than root owns.
var ErrUserSymlink = errors.New("symlink not owned by root")

// Symlinks checks only the symlinks the kernel follows to reach the absolute path: each must
// be root's (ErrUserSymlink otherwise), whoever owns the directories. Where a user may own
// a directory on the way but must not have redirected it (a socket CRIU binds there).
func Symlinks(abs string) error {
	return walk(abs, func(string, fs.FileInfo) error { return nil })
}

// maxLinks is how many symlinks a walk follows before it gives up, as the kernel does (40).
const maxLinks = 40

// walk follows abs from / as the kernel does, applying checkDir to each directory and file
// it passes through; every symlink on the way must be root's.
func walk(abs string, checkDir func(string, fs.FileInfo) error) error {
	fi, err := os.Lstat("/")
	if err != nil {
		return err
	}
	if err := checkDir("/", fi); err != nil {
		return err
	}
	cur, rest, links := "/", strings.Split(abs, "/"), 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		if name == "" || name == "." {
			continue
		}
		if name == ".." {
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if err := checkDir(next, fi); err != nil {
				return err
			}
			cur = next
			continue
		}
		if owner(fi) != 0 {
			return fmt.Errorf("%s is a %w", next, ErrUserSymlink)
		}
		if links++; links > maxLinks {
			return fmt.Errorf("%s: too many levels of symbolic links", abs)
		}
		to, err := os.Readlink(next)
		if err != nil {
			return err
		}
		if filepath.IsAbs(to) {
			cur = "/"
		}
		rest = append(strings.Split(to, "/"), rest...)
	}
	return nil
}

// check applies Mode to fi, the file at path, a root-owned sticky directory excepted.
func check(path string, fi fs.FileInfo) error {
	if err := Mode(path, fi); err != nil && !(fi.Mode()&os.ModeSticky != 0 && owner(fi) == 0) {
		return err
	}
	return nil
}

func owner(fi fs.FileInfo) uint32 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return ^uint32(0)
}
