package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

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
// CRIU files are in criuDir: each as the frozen process holds it (host maps the image's
// PIDs to this host's), whatever its path names by now — a user who swapped the file at its
// path between CRIU's dump and this record had their own recorded as the job's (hostile
// test) — and one no process holds (a path CRIU took otherwise) as the host has it now.
func reopenedFiles(criuDir string, host map[int]int) ([]image.HostFile, error) {
	opened, err := criuimg.OpenedFiles(criuDir)
	if err != nil {
		return nil, fmt.Errorf("read the image's files: %w", err)
	}
	paths := criuimg.PathsOf(opened)
	held := map[string]image.HostFile{}
	for _, imagePID := range slices.Sorted(maps.Keys(opened)) {
		pid, ok := host[imagePID]
		if !ok {
			continue
		}
		for p, f := range heldFiles("/proc", pid, opened[imagePID]) {
			if _, seen := held[p]; !seen {
				held[p] = f
			}
		}
	}
	var out []image.HostFile
	for _, p := range paths {
		f, ok := held[p]
		if !ok {
			if f, err = hostFile(p); errors.Is(err, fs.ErrNotExist) {
				continue // gone already: a restore names it as missing
			}
			if err != nil {
				return nil, err
			}
		}
		if f.Kind == "device" {
			continue // the host's, made by its kernel and udev, and its own on another host
		}
		out = append(out, f)
	}
	return out, nil
}

// heldFiles describes, by the paths o gives them, the files process pid (its /proc under
// procRoot) holds as descriptors, mappings, program, working and root directories: the
// files themselves, through /proc's links, not what their paths name. One it no longer
// holds is left out.
func heldFiles(procRoot string, pid int, o *criuimg.Opened) map[string]image.HostFile {
	proc := filepath.Join(procRoot, strconv.Itoa(pid))
	out := map[string]image.HostFile{}
	add := func(link, path string) {
		var st unix.Stat_t
		if path == "" || unix.Stat(filepath.Join(proc, link), &st) != nil {
			return
		}
		out[path] = image.HostFile{Path: path, UID: st.Uid, GID: st.Gid, Kind: kind(st.Mode)}
	}
	for fd, p := range o.FDs {
		add(filepath.Join("fd", strconv.Itoa(fd)), p)
	}
	add("exe", o.Exe)
	add("cwd", o.Cwd)
	add("root", o.Root)
	if len(o.Maps) > 0 {
		files, _ := os.ReadDir(filepath.Join(proc, "map_files")) // "start-end", in hex
		for _, f := range files {
			lo, _, _ := strings.Cut(f.Name(), "-")
			if start, err := strconv.ParseUint(lo, 16, 64); err == nil && o.Maps[start] != "" {
				add(filepath.Join("map_files", f.Name()), o.Maps[start])
			}
		}
	}
	return out
}

// checkHeld refuses, once CRIU has reopened them and before any task runs, a file a
// restored process holds whose owner or kind is not what the image recorded for its path:
// the check before CRIU looks at the path, and a user who swapped files at it in between
// had root's restored job hold theirs (hostile test). made maps the image's PIDs to the
// restored processes'.
func checkHeld(procRoot string, want map[int]*criuimg.Opened, made map[int]int, recorded []image.HostFile) error {
	byPath := map[string]image.HostFile{}
	for _, f := range recorded {
		byPath[f.Path] = f
	}
	for _, imagePID := range slices.Sorted(maps.Keys(made)) {
		o := want[imagePID]
		if o == nil {
			continue
		}
		held := heldFiles(procRoot, made[imagePID], o)
		for _, p := range slices.Sorted(maps.Keys(held)) {
			was, ok := byPath[p]
			if now := held[p]; ok && (now.UID != was.UID || now.Kind != was.Kind) {
				return fmt.Errorf("%w: %s, as the restored process %d holds it, is a %s of uid %d, and was a %s of uid %d when checkpointed; "+
					"another user may have put it there: put the job's own file back (or give it its owner again) and restore again",
					ErrFileChanged, p, made[imagePID], now.Kind, now.UID, was.Kind, was.UID)
			}
		}
	}
	return nil
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
