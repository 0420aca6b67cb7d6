package engine

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
)

// CRIU opens a restored process's files again by their paths, and checks little more than
// their size: a file gone from a directory others may write (/tmp, /dev/shm) and put back
// there by another user, same size, had root's restored job run that user's shell code or
// write its output into that user's file (hostile test). A checkpoint records each such
// file's owner and kind; a restore refuses one that changed.

// reopenedFiles describes the files CRIU reopens by path when it restores the image whose
// CRIU files are in criuDir, as this host has them now.
func reopenedFiles(criuDir string) ([]image.HostFile, error) {
	paths, err := criuimg.ReopenedPaths(criuDir)
	if err != nil {
		return nil, fmt.Errorf("read the image's files: %w", err)
	}
	var out []image.HostFile
	for _, p := range paths {
		f, err := hostFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone already: a restore names it as missing
		}
		if err != nil {
			return nil, err
		}
		if f.Kind == "device" {
			continue // the host's, made by its kernel and udev, and its own on another host
		}
		out = append(out, f)
	}
	return out, nil
}

// checkReopened refuses an image whose reopened files changed owner or kind on this host
// since the checkpoint. A missing one is left to filesPresent, which names its user; a
// device is never recorded.
func checkReopened(m *image.Manifest) error {
	for _, was := range m.Reopened {
		if was.Kind == "device" {
			continue
		}
		now, err := hostFile(was.Path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		// The owner, who could have put it there, and its kind; not its group, which
		// differs between hosts (a render group's) without anyone's doing.
		if now.UID != was.UID || now.Kind != was.Kind {
			return fmt.Errorf("%w: %s is a %s of uid %d now, and was a %s of uid %d when checkpointed; "+
				"another user may have put it there: put the job's own file back (or give it its owner again) and restore again",
				ErrFileChanged, was.Path, now.Kind, now.UID, was.Kind, was.UID)
		}
	}
	return nil
}

// hostFile describes the file at path, not following a symlink there.
func hostFile(path string) (image.HostFile, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return image.HostFile{}, &fs.PathError{Op: "lstat", Path: path, Err: err}
	}
	return image.HostFile{Path: path, UID: st.Uid, GID: st.Gid, Kind: kind(st.Mode)}, nil
}

func kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	}
	return "device"
}
