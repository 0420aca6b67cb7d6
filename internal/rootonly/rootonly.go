// Package rootonly tells whether only root can change a file or a path: gpucr runs as root
// what it installed, and restores what it checked, only where no user could have swapped it.
package rootonly

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// Walk checks that path, its symlinks resolved, and every directory above it belong to root
// and are writable by no one else, a root-owned sticky directory (as /tmp) excepted: there
// others cannot rename or remove what root owns.
func Walk(path string) error {
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	for {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if err := Mode(p, fi); err != nil && !(fi.Mode()&os.ModeSticky != 0 && owner(fi) == 0) {
			return err
		}
		if p == filepath.Dir(p) {
			return nil // the root
		}
		p = filepath.Dir(p)
	}
}

func owner(fi fs.FileInfo) uint32 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return ^uint32(0)
}
