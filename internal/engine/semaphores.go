package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/safety"
)

// CRIU dumps a POSIX semaphore that a process maps under the temporary name sem_open made
// it with (Python's multiprocessing under spawn and forkserver) only through a hard link it
// leaves beside the file, /dev/shm/link_remap.N, and its restore consumes the link: a
// second restore from the image failed, and one on another host could not start. A
// checkpoint records each such file in the image and removes CRIU's link; each restore
// makes the file (if gone) and the link again before CRIU runs.

// linkedFiles records the semaphores CRIU dumped through links from the frozen tree's
// image in criuDir, and removes CRIU's links. The tree is analysed again, frozen: a file it
// held deleted but linked since the analysis, which CRIU dumped through a link too, fails
// the checkpoint rather than leave the image depending on a link outside it.
func linkedFiles(criuDir string, tree *proctree.Snapshot) (_ []image.LinkedFile, err error) {
	remaps, err := criuimg.LinkRemaps(criuDir)
	if err != nil {
		return nil, fmt.Errorf("read the image's link remaps: %w", err)
	}
	// Every link CRIU made for this dump goes, recorded or not: one left where it was made
	// stopped the next checkpoint of a job alike in CRIU, its name taken (review).
	defer func() {
		if rerr := removeLinks(remaps); err == nil {
			err = rerr
		}
	}()
	sems, err := safety.Semaphores(tree)
	if err != nil {
		return nil, err
	}
	dir, err := beneath.OpenDir(safety.ShmDir)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	out := make([]image.LinkedFile, 0, len(remaps))
	for _, r := range remaps {
		if filepath.Dir(r) != safety.ShmDir {
			return nil, fmt.Errorf("CRIU dumped a file through a link outside %s (%s), which gpucr does not carry", safety.ShmDir, r)
		}
		f, err := linkedFile(dir, filepath.Base(r), sems)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// removeLinks removes the links CRIU made for a dump (its image's link remaps); one gone
// already is no error.
func removeLinks(remaps []string) error {
	var errs []error
	for _, r := range remaps {
		if err := os.Remove(r); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove CRIU's link %s: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

// linkedFile records the semaphore of sems that CRIU's link remap, in dir, links to.
func linkedFile(dir *beneath.Dir, remap string, sems []safety.Semaphore) (image.LinkedFile, error) {
	f, err := dir.Open(remap)
	if err != nil {
		return image.LinkedFile{}, fmt.Errorf("CRIU's link: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return image.LinkedFile{}, err
	}
	i := slices.IndexFunc(sems, func(s safety.Semaphore) bool { return os.SameFile(s.Info, info) })
	if i < 0 {
		return image.LinkedFile{}, fmt.Errorf("CRIU dumped %s through a link to a file that is none of the tree's semaphores", f.Name())
	}
	data, err := io.ReadAll(io.LimitReader(f, image.MaxLinkedFile+1))
	if err != nil {
		return image.LinkedFile{}, fmt.Errorf("read %s: %w", sems[i].Path, err)
	}
	if len(data) > image.MaxLinkedFile {
		return image.LinkedFile{}, fmt.Errorf("%s has grown beyond %d bytes", sems[i].Path, image.MaxLinkedFile)
	}
	st := info.Sys().(*syscall.Stat_t)
	return image.LinkedFile{Path: sems[i].Path, Remap: remap, Mode: uint32(info.Mode().Perm()), UID: st.Uid, GID: st.Gid, Data: data}, nil
}

// ErrLinkedFileChanged means a semaphore's file of the image is on this host as other than
// the image's: other bytes (the job, or an earlier restore of it, ran on and changed it),
// another owner, group or mode (another user may have made it first), or its link's name
// taken by another file.
var ErrLinkedFileChanged = errors.New("a semaphore of the image changed since the checkpoint")

// placeLinked makes, before CRIU restores the image, the files and links CRIU restores its
// semaphores through: a file gone is made with the image's bytes, mode and owner, and one
// present must hold the image's bytes, mode and owner (placeFile). The links are journaled first (journal), for a
// rollback to remove. It returns what undoes what it made, for a restore that fails (CRIU
// removes the links of one that succeeds).
func placeLinked(files []image.LinkedFile, journal func(paths []string) error) (func() error, error) {
	undo := func() error { return nil }
	if len(files) == 0 {
		return undo, nil
	}
	var links []string
	for _, f := range files {
		links = append(links, filepath.Join(safety.ShmDir, f.Remap))
	}
	if err := journal(links); err != nil {
		return nil, err
	}
	dir, err := beneath.OpenDir(safety.ShmDir)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	// What was made is removed only while its name is still the file made: CRIU takes the
	// link as it opens the file, and another restore whose image names the same
	// link_remap.N (CRIU numbers them by the file's id, alike for jobs alike) may make the
	// name again for its own job meanwhile.
	type entry struct {
		name string
		file os.FileInfo
	}
	var made []entry
	undo = func() error {
		d, err := beneath.OpenDir(safety.ShmDir)
		if err != nil {
			return err
		}
		defer d.Close()
		var errs []error
		for _, e := range slices.Backward(made) {
			if isEntry(d, e.name, e.file) {
				errs = append(errs, d.Remove(e.name))
			}
		}
		return errors.Join(errs...)
	}
	for _, f := range files {
		name := filepath.Base(f.Path)
		file, created, err := placeFile(dir, name, f)
		var info os.FileInfo
		if err == nil {
			if info, err = file.Stat(); err != nil {
				err = fmt.Errorf("stat %s: %w", f.Path, err)
			}
		}
		if created && info != nil {
			made = append(made, entry{name, info})
		}
		if err == nil {
			// Linked through the descriptor checked, not by name: the name's owner may
			// swap it (for a symlink) at any moment.
			err = dir.LinkFile(file, f.Remap)
			switch {
			case err == nil:
				made = append(made, entry{f.Remap, info})
			case errors.Is(err, fs.ErrExist) && isEntry(dir, f.Remap, info):
				err = nil // a link an earlier restore made and left
			case errors.Is(err, fs.ErrExist):
				err = fmt.Errorf("%w: %s/%s, which the restore links to %s, is another file (another restore's, of a job whose image names the same link, "+
					"may be under way): restore again once no restore is, removing it first if it is still there",
					ErrLinkedFileChanged, safety.ShmDir, f.Remap, f.Path)
			}
		}
		if file != nil {
			_ = file.Close()
		}
		if err != nil {
			return nil, errors.Join(err, undo())
		}
	}
	return undo, nil
}

// placeFile makes the semaphore's file name in dir with f's bytes, mode and owner, written
// aside and linked into place so that no name is ever followed or replaced, or checks that
// the file there is f's: its bytes, and its owner and mode, as another user may have made
// it first with the bytes of a semaphore (the name is for all to see, and the bytes are
// easily guessed). It returns the file, open, and says whether it made it.
func placeFile(dir *beneath.Dir, name string, f image.LinkedFile) (*os.File, bool, error) {
	tmp, tmpName, err := dir.CreateTemp(".gpucr-" + name + ".")
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = dir.Remove(tmpName) }() // linked into place, or not wanted
	_, err = tmp.Write(f.Data)
	if err == nil {
		err = tmp.Chown(int(f.UID), int(f.GID))
	}
	if err == nil {
		err = tmp.Chmod(fs.FileMode(f.Mode))
	}
	if err == nil {
		// Through the descriptor: once chowned, its owner may swap the name tmpName.
		err = dir.LinkFile(tmp, name)
	}
	if err == nil {
		return tmp, true, nil
	}
	_ = tmp.Close()
	if !errors.Is(err, fs.ErrExist) {
		return nil, false, fmt.Errorf("make %s: %w", f.Path, err)
	}
	now, err := dir.Open(name)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %s: %v", ErrLinkedFileChanged, f.Path, err)
	}
	if err := sameLinked(now, f); err != nil {
		_ = now.Close()
		return nil, false, err
	}
	return now, false, nil
}

// sameLinked checks that the open file is f's: its owner, mode and bytes.
func sameLinked(file *os.File, f image.LinkedFile) error {
	info, err := file.Stat()
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrLinkedFileChanged, f.Path, err)
	}
	st := info.Sys().(*syscall.Stat_t)
	if st.Uid != f.UID || st.Gid != f.GID || uint32(info.Mode().Perm()) != f.Mode {
		return fmt.Errorf("%w: %s is uid %d, gid %d, mode %o, where the image's is uid %d, gid %d, mode %o (another user may have made it); "+
			"remove it if no process uses it (fuser %s), and restore again", ErrLinkedFileChanged, f.Path,
			st.Uid, st.Gid, info.Mode().Perm(), f.UID, f.GID, f.Mode, f.Path)
	}
	now, err := io.ReadAll(io.LimitReader(file, image.MaxLinkedFile+1))
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrLinkedFileChanged, f.Path, err)
	}
	if !bytes.Equal(now, f.Data) {
		return fmt.Errorf("%w: %s holds other bytes than at the checkpoint (the job, or an earlier restore of it, ran on); "+
			"remove it if no process uses it (fuser %s), and restore again", ErrLinkedFileChanged, f.Path, f.Path)
	}
	return nil
}

// isEntry says whether name in dir is the file info describes.
func isEntry(dir *beneath.Dir, name string, info os.FileInfo) bool {
	now, err := dir.Lstat(name)
	return err == nil && os.SameFile(now, info)
}
