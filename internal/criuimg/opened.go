package criuimg

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/rootonly"
)

// ErrReopenedElsewhere means CRIU reopened a file of the image at another file than the one
// the process had: CRIU opens each file by its path, as root, following symlinks, and
// checks only its size and mode, so a user who can change a directory on the way (their
// own home, say) had root hand the restored process a descriptor on a root-only file of the
// same size and mode (a hostile test, 2026-11-26: a file of /etc opened read-write).
var ErrReopenedElsewhere = errors.New("a file the process had open was reopened at another path")

// Opened is what one process of an image had open, mapped or ran, by path, as CRIU saved it.
// "" is a file carried in the image, or unknown.
type Opened struct {
	FDs       map[int]string    // descriptor -> path
	Maps      map[uint64]string // start of a file mapping -> path
	Exe       string            // its program
	Cwd, Root string            // its working and root directories
}

// PathsOf lists, sorted and once each, the paths the processes of opened hold, map, run
// or work in: of OpenedFiles, this host's files that CRIU opens again by name on restore,
// as MissingFiles asks for (not a pty CRIU recreates by its index).
func PathsOf(opened map[int]*Opened) []string {
	var out []string
	for _, o := range opened {
		out = append(out, o.Exe, o.Cwd, o.Root)
		out = slices.AppendSeq(out, maps.Values(o.FDs))
		out = slices.AppendSeq(out, maps.Values(o.Maps))
	}
	out = slices.DeleteFunc(out, func(p string) bool { return p == "" })
	slices.Sort(out)
	return slices.Compact(out)
}

// OpenedFiles lists, for each process of the image at dir (by its image PID), the files it
// had open as descriptors, mapped, or ran, by the paths CRIU reopens them at. Files CRIU
// carries inside the image are left out; so is an image with its own mount namespace, whose
// paths are not this host's.
func OpenedFiles(dir string) (map[int]*Opened, error) {
	fsys, n, paths, err := reopenedOnHost(dir)
	if err != nil || paths == nil {
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
		switch u.kind {
		case useFD:
			o.FDs[u.fd] = p
		case useExe:
			o.Exe = p
		case useMap:
			o.Maps[u.start] = p
		case useCwd:
			o.Cwd = p
		case useRoot:
			o.Root = p
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CheckReopened checks that every process CRIU restored (made maps image PIDs to host PIDs,
// its /proc under procRoot) holds, at each descriptor, mapping, program, working and root
// directory the image lists in want, the file at the path the image gives: the kernel names
// a file by the path it was reached at, so a symlink followed on the way (a directory of the
// path swapped for one since the checkpoint) shows as another path, and the restore is
// refused before any task runs. A path in /proc of a process outside the restored tree names
// whatever process has that PID now (a root daemon's memory, say), however alike the path:
// procfs lists where procfs is mounted in gpucr's mount namespace (a chroot's too).
func CheckReopened(procRoot string, procfs []string, want map[int]*Opened, made map[int]int) error {
	restored := map[int]bool{}
	for _, pid := range made {
		restored[pid] = true
	}
	// A /proc path names one of the restored processes, or one of their threads (CRIU
	// restores threads at their IDs).
	ours := func(n int) bool {
		if restored[n] {
			return true
		}
		tgid, err := proctree.ThreadGroup(n)
		return err == nil && restored[tgid]
	}
	for _, imagePID := range slices.Sorted(maps.Keys(made)) {
		o := want[imagePID]
		if o == nil {
			continue
		}
		proc := filepath.Join(procRoot, strconv.Itoa(made[imagePID]))
		check := func(what, link, was string) error {
			if was == "" {
				return nil
			}
			if n, ok := procPID(procfs, was); ok && !ours(n) {
				return fmt.Errorf("%w: PID %d's %s is %s, of process %d, which the restore did not make: that PID is another process's now",
					ErrReopenedElsewhere, imagePID, what, was, n)
			}
			got, err := os.Readlink(filepath.Join(proc, link))
			if err != nil {
				return fmt.Errorf("%w: PID %d's %s (%s): %v", ErrReopenedElsewhere, imagePID, what, was, err)
			}
			if path.Clean(got) != was {
				return fmt.Errorf("%w: PID %d's %s was %s when checkpointed and is %s now: a directory on the way was changed (a symlink?)",
					ErrReopenedElsewhere, imagePID, what, was, got)
			}
			return nil
		}
		for _, fd := range slices.Sorted(maps.Keys(o.FDs)) {
			if err := check(fmt.Sprintf("descriptor %d", fd), filepath.Join("fd", strconv.Itoa(fd)), o.FDs[fd]); err != nil {
				return err
			}
		}
		for _, c := range []struct{ what, link, was string }{{"program", "exe", o.Exe}, {"working directory", "cwd", o.Cwd}, {"root", "root", o.Root}} {
			if err := check(c.what, c.link, c.was); err != nil {
				return err
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
			was := o.Maps[start]
			if n, ok := procPID(procfs, was); ok && !ours(n) {
				return fmt.Errorf("%w: PID %d maps %s, of process %d, which the restore did not make", ErrReopenedElsewhere, imagePID, was, n)
			}
			got, ok := mapped[start]
			if !ok || strings.ContainsRune(was, '\n') {
				continue // merged into the mapping before it, or a name maps cannot show as it is
			}
			if path.Clean(got) != was {
				return fmt.Errorf("%w: PID %d's mapping at %#x was %s when checkpointed and is %s now", ErrReopenedElsewhere, imagePID, start, was, got)
			}
		}
	}
	return nil
}

// procPID is the PID of a path in PROCFS/PID/, for any of the procfs mount points, if it is
// one.
func procPID(procfs []string, p string) (int, bool) {
	for _, root := range procfs {
		rest, ok := strings.CutPrefix(p, strings.TrimSuffix(root, "/")+"/")
		if !ok {
			continue
		}
		first, _, _ := strings.Cut(rest, "/")
		if n, err := strconv.Atoi(first); err == nil {
			return n, true
		}
	}
	return 0, false
}

// readMaps reads a /proc/PID/maps file: each mapping's start and the path it maps ("" for
// anonymous memory).
func readMaps(path string) (map[uint64]string, error) {
	ms, err := proctree.ReadMaps(path)
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]string, len(ms))
	for _, m := range ms {
		out[m.Start] = m.Path
	}
	return out, nil
}

// ErrSocketUnderSymlink means a named unix socket of the image lies, on this host, beneath a
// directory that is a symlink: before it restores the processes CRIU, as root, removes
// whatever socket is at the name, following symlinks, and binds the image's socket there,
// owned by its user (a swapped directory would have had it take the place of a system
// socket, /run/dbus's say).
var ErrSocketUnderSymlink = errors.New("a unix socket the image binds lies beneath a symlink")

// CheckSocketDirs refuses, before CRIU starts, an image of the tree at dir whose named unix
// sockets would be bound through a symlink someone other than root made: on the way to each
// socket's directory (its name's, or the directory CRIU binds a relative name from) every
// symlink must be root's (as /var/run is, to /run). A tree with its own mount namespace is
// not checked (its paths are not the host's). This is a check before CRIU runs, not a
// guard while it does.
func CheckSocketDirs(dir string) error {
	if OwnMounts(dir) {
		return nil
	}
	entries, err := decode(newBudget(), os.DirFS(dir), "files.img", &fdinfo.FileEntry{})
	if err != nil {
		return err
	}
	for _, e := range entries {
		u := e.GetUsk()
		name := string(u.GetName())
		if name == "" || name[0] == 0 { // unnamed, or in the abstract namespace
			continue
		}
		d := u.GetNameDir()
		if filepath.IsAbs(name) {
			d = filepath.Dir(name)
		}
		if !filepath.IsAbs(d) {
			continue
		}
		// A directory that is not there fails CRIU on its own, binding nothing there.
		if err := rootonly.Symlinks(d); errors.Is(err, rootonly.ErrUserSymlink) {
			return fmt.Errorf("%w: %v, on the way to the socket %s; restore where the socket's directory is what it was", ErrSocketUnderSymlink, err, name)
		}
	}
	return nil
}

// OutputFiles lists the regular files that the processes of the image at dir hold open
// write-only, by their names from the image's root ("/" trimmed, as CRIU's errors name
// them), with the size CRIU recorded for each: a job's output, which it may go on writing
// after a --leave-running checkpoint, and which CRIU then refuses to restore. A file opened
// to append has no size (-1): CRIU does not check it. A file open for reading too (a
// database, shared memory) is not output: what changed in it is not only its end.
func OutputFiles(dir string) (map[string]int64, error) {
	entries, err := decode(newBudget(), os.DirFS(dir), "files.img", &fdinfo.FileEntry{})
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, e := range entries {
		if r := e.GetReg(); r != nil && r.GetFlags()&unix.O_ACCMODE == unix.O_WRONLY {
			size := int64(-1)
			if r.Size != nil {
				size = int64(r.GetSize())
			}
			out[strings.TrimLeft(r.GetName(), "/")] = size
		}
	}
	return out, nil
}
