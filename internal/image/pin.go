package image

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/rootonly"
)

// What a restore verifies must be what CRIU reads: CRIU opens its files by name long after
// gpucr checked them, so a file swapped in between (by anyone who may write in the image's
// directory, the case a signed image on shared storage exists for) would be restored
// unchecked. An image only root can change is used in place; any other has the files CRIU
// reads copied to a private directory first, and those copies are what is checked and
// restored. The memory gpucr saved itself (criuimg.MemDir) needs neither: the fill verifies each
// byte as it reads it.

// OnlyRootCanChange reports whether nobody but root can change or add a file that a restore
// of dir hands to CRIU: no symlink on the way (one could be turned to another image between
// the checks and CRIU's open; callers resolve dir first, see Resolve), every directory from
// / to dir's criu/ root's and not writable by others (a sticky one, as /tmp, may be, above
// the image), and so are files.
func OnlyRootCanChange(dir string, files []File) (bool, error) {
	abs, err := filepath.Abs(CRIUPath(dir))
	if err != nil {
		return false, fmt.Errorf("image %s: %w", dir, err)
	}
	real, err := Resolve(abs)
	if err != nil {
		return false, err
	}
	if real != abs {
		return false, nil // a symlink on the way could lead elsewhere by the time CRIU opens it
	}
	// Others may not add files to criu/ itself, sticky or not: CRIU opens optional images
	// that the manifest does not list. Above it, a root-owned sticky directory may be open.
	fi, err := os.Stat(real)
	if err != nil {
		return false, fmt.Errorf("image %s: %w", dir, err)
	}
	if rootonly.Mode(real, fi) != nil || rootonly.Walk(filepath.Dir(real)) != nil {
		return false, nil
	}
	pinned, _ := SplitPinned(files)
	for _, f := range pinned {
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(f.Path)))
		if err != nil {
			return false, nil // checked, and named, by CheckSizes
		}
		if rootonly.Mode(f.Path, fi) != nil {
			return false, nil
		}
	}
	return true, nil
}

// Resolve is dir as an absolute path with no symlink in it: a restore reads the image only
// through it, so that a symlink retargeted midway cannot hand CRIU another image than the
// one checked.
func Resolve(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", dir, err)
	}
	return real, nil
}

// SplitPinned separates the files a restore pins (all but criuimg.MemDir's: CRIU's, and
// what else the image lists) from the memory gpucr saved itself.
func SplitPinned(files []File) (pinned, mem []File) {
	for _, f := range files {
		if path.Dir(f.Path) == criuimg.MemDir {
			mem = append(mem, f)
		} else {
			pinned = append(pinned, f)
		}
	}
	return pinned, mem
}

// Pin copies the files of dir that a restore hands to CRIU (all listed but criuimg.MemDir's) into
// private, an empty directory only root can write, under the same relative paths: an image
// root to check and restore from in dir's place (its memory still read from dir). It never
// follows a symlink or leaves dir, copies no more of a file than the manifest lists (the
// copies are checked afterwards, not here), and refuses first what would fill private's
// file system: whoever may write in dir may grow a file after its size was checked
// (review).
func Pin(dir, private string, files []File) error {
	if err := os.MkdirAll(CRIUPath(private), 0o700); err != nil {
		return fmt.Errorf("private copy of %s: %w", dir, err)
	}
	pinned, _ := SplitPinned(files)
	var total int64
	for _, f := range pinned {
		total += f.Size
	}
	if err := diskroom.Check(private, total); err != nil {
		return fmt.Errorf("private copy of %s: %w", dir, err)
	}
	for _, f := range pinned {
		if err := pinFile(dir, private, f); err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) && errors.Is(err, fs.ErrNotExist) {
				return &CorruptError{f.Path, "missing"}
			}
			return fmt.Errorf("private copy of %s: %w", dir, err)
		}
	}
	return nil
}

func pinFile(dir, private string, f File) error {
	rel := f.Path
	src, err := beneath.Open(dir, filepath.FromSlash(rel))
	if err != nil {
		return err
	}
	defer src.Close()
	to := filepath.Join(private, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		return err
	}
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// One byte past the listed size shows the file grew; the check that follows names it.
	if _, err := io.CopyN(dst, src, f.Size+1); err != nil && !errors.Is(err, io.EOF) {
		dst.Close()
		return err
	}
	return dst.Close()
}
