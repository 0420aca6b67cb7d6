package criuimg

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrReopenedElsewhere means CRIU reopened a file of the image at another file than the one
// the process had: CRIU opens each file by its path, as root, following symlinks, and
// checks only its size and mode, so a user who can change a directory on the way (their
// own home, say) had root hand the restored process a descriptor on a root-only file of the
// same size and mode (a hostile test, 2026-11-26: a file of /etc opened read-write).
var ErrReopenedElsewhere = errors.New("a file the process had open was reopened at another path")

// Opened is what one process of an image had open, mapped or ran, by path, as CRIU saved it.
type Opened struct {
	FDs  map[int]string    // descriptor -> path
	Maps map[uint64]string // start of a file mapping -> path
	Exe  string            // its program; "" when carried in the image or unknown
}

// OpenedFiles lists, for each process of the image at dir (by its image PID), the files it
// had open as descriptors, mapped, or ran, by the paths CRIU reopens them at. Files CRIU
// carries inside the image are left out; so is an image with its own mount namespace, whose
// paths are not this host's.
func OpenedFiles(dir string) (map[int]*Opened, error) {
	if OwnMounts(dir) {
		return nil, nil
	}
	fsys, n := os.DirFS(dir), newBudget()
	paths, err := reopenedPaths(n, fsys)
	if err != nil {
		return nil, err
	}
	out := map[int]*Opened{}
	err = eachUse(n, fsys, func(u fileUse) {
		p, ok := paths[u.id]
		if !ok {
			return
		}
		o := out[u.pid]
		if o == nil {
			o = &Opened{FDs: map[int]string{}, Maps: map[uint64]string{}}
			out[u.pid] = o
		}
		switch {
		case u.exe:
			o.Exe = p
		case u.fd >= 0:
			o.FDs[u.fd] = p
		default:
			o.Maps[u.start] = p
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CheckReopened checks that every process CRIU restored (made maps image PIDs to host PIDs,
// its /proc under procRoot) holds, at each descriptor, mapping and program the image lists
// in want, the file at the path the image gives: the kernel names a file by the path it was
// reached at, so a symlink followed on the way (a directory of the path swapped for one
// since the checkpoint) shows as another path, and the restore is refused before any task
// runs.
func CheckReopened(procRoot string, want map[int]*Opened, made map[int]int) error {
	for _, imagePID := range slices.Sorted(maps.Keys(made)) {
		o := want[imagePID]
		if o == nil {
			continue
		}
		proc := filepath.Join(procRoot, strconv.Itoa(made[imagePID]))
		for _, fd := range slices.Sorted(maps.Keys(o.FDs)) {
			got, err := os.Readlink(filepath.Join(proc, "fd", strconv.Itoa(fd)))
			if err != nil {
				return fmt.Errorf("%w: PID %d's descriptor %d (%s): %v", ErrReopenedElsewhere, imagePID, fd, o.FDs[fd], err)
			}
			if got != o.FDs[fd] {
				return fmt.Errorf("%w: PID %d's descriptor %d was %s when checkpointed and is %s now: a directory on the way was changed (a symlink?)",
					ErrReopenedElsewhere, imagePID, fd, o.FDs[fd], got)
			}
		}
		if o.Exe != "" {
			if got, err := os.Readlink(filepath.Join(proc, "exe")); err == nil && got != o.Exe {
				return fmt.Errorf("%w: PID %d's program was %s when checkpointed and is %s now", ErrReopenedElsewhere, imagePID, o.Exe, got)
			}
		}
		if len(o.Maps) == 0 {
			continue
		}
		mapped, err := readMaps(filepath.Join(proc, "maps"))
		if err != nil {
			return fmt.Errorf("%w: PID %d: %v", ErrReopenedElsewhere, imagePID, err)
		}
		for _, start := range slices.Sorted(maps.Keys(o.Maps)) {
			p := o.Maps[start]
			got, ok := mapped[start]
			if !ok || strings.ContainsRune(p, '\n') {
				continue // merged into the mapping before it, or a name maps cannot show as it is
			}
			if got != p {
				return fmt.Errorf("%w: PID %d's mapping at %#x was %s when checkpointed and is %s now", ErrReopenedElsewhere, imagePID, start, p, got)
			}
		}
	}
	return nil
}

// readMaps reads a /proc/PID/maps file: each mapping's start and the path it maps ("" for
// anonymous memory). A line is "start-end perms offset dev inode", then spaces and the path,
// which may hold spaces itself.
func readMaps(path string) (map[uint64]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[uint64]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		rest := sc.Text()
		var field [5]string
		for i := range field {
			field[i], rest, _ = strings.Cut(strings.TrimLeft(rest, " "), " ")
		}
		lo, _, _ := strings.Cut(field[0], "-")
		start, err := strconv.ParseUint(lo, 16, 64)
		if err != nil {
			continue
		}
		out[start] = strings.TrimLeft(rest, " ")
	}
	return out, sc.Err()
}
