package proctree

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Snapshot is a set of processes and what the checks of one operation read of each: open
// files, mappings, environment, thread names. Each is read from procfs at most once, on
// first use, so every check and backend of the operation sees the same answer and none
// pays for reading it again. Memory maps read after the tree is frozen (the memory gpucr
// saves) are read then, not from here: the GPU checkpoint changes them.
type Snapshot struct {
	root  string
	procs []Process

	mu      sync.Mutex
	files   map[int]cached[[]string]
	maps    map[int][]byte
	env     map[int][]byte
	threads map[int][]string
}

type cached[T any] struct {
	v   T
	err error
}

// Snap is the snapshot of procs, read under procRoot ("/proc" outside tests).
func Snap(procRoot string, procs []Process) *Snapshot {
	return &Snapshot{root: procRoot, procs: procs,
		files: map[int]cached[[]string]{}, maps: map[int][]byte{}, env: map[int][]byte{}, threads: map[int][]string{}}
}

// Processes are the snapshot's processes, in the order given.
func (s *Snapshot) Processes() []Process { return s.procs }

// PIDs lists the snapshot's processes.
func (s *Snapshot) PIDs() []int { return PIDs(s.procs) }

// Command is pid's command name, or "" for a process not in the snapshot.
func (s *Snapshot) Command(pid int) string {
	for _, p := range s.procs {
		if p.PID == pid {
			return p.Command
		}
	}
	return ""
}

// Files is what pid's descriptors point at, as OpenFiles reads it.
func (s *Snapshot) Files(pid int) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.files[pid]
	if !ok {
		c.v, c.err = OpenFiles(s.root, pid)
		s.files[pid] = c
	}
	return c.v, c.err
}

// Maps is pid's /proc/PID/maps; empty for a process that is gone or unreadable.
func (s *Snapshot) Maps(pid int) []byte { return s.file(s.maps, pid, "maps") }

// Environ is pid's environment, NUL-separated; empty for a process gone or unreadable.
func (s *Snapshot) Environ(pid int) []byte { return s.file(s.env, pid, "environ") }

func (s *Snapshot) file(cache map[int][]byte, pid int, name string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := cache[pid]
	if !ok {
		b, _ = os.ReadFile(filepath.Join(s.root, strconv.Itoa(pid), name))
		cache[pid] = b
	}
	return b
}

// ThreadNames are the names (comm) of pid's threads.
func (s *Snapshot) ThreadNames(pid int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names, ok := s.threads[pid]
	if !ok {
		dir := filepath.Join(s.root, strconv.Itoa(pid), "task")
		tasks, _ := os.ReadDir(dir)
		for _, t := range tasks {
			if b, err := os.ReadFile(filepath.Join(dir, t.Name(), "comm")); err == nil {
				names = append(names, strings.TrimSpace(string(b)))
			}
		}
		s.threads[pid] = names
	}
	return names
}

// End is one end of a pipe or FIFO a process holds: what its descriptor points at
// ("pipe:[N]", or a FIFO's path) and whether it reads or writes through it.
type End struct {
	Target      string
	Read, Write bool
	// fifo is a FIFO's file (nil for a pipe, whose "pipe:[N]" names one pipe host-wide): its
	// path names it only in the holder's mount namespace.
	fifo os.FileInfo
}

// StdioPipes are the pipe and FIFO ends on pid's standard descriptors (0, 1, 2).
func (s *Snapshot) StdioPipes(pid int) []End {
	var out []End
	for fd := range 3 {
		if e, ok := s.end(pid, fd); ok {
			out = append(out, e)
		}
	}
	return out
}

// end reads descriptor fd of pid as a pipe's end; not ok for anything else.
func (s *Snapshot) end(pid, fd int) (End, bool) {
	link := filepath.Join(s.root, strconv.Itoa(pid), "fd", strconv.Itoa(fd))
	target, err := os.Readlink(link)
	if err != nil {
		return End{}, false
	}
	var fifo os.FileInfo
	if !strings.HasPrefix(target, "pipe:[") {
		if fifo, err = os.Stat(link); err != nil || fifo.Mode()&os.ModeNamedPipe == 0 {
			return End{}, false
		}
	}
	e := End{Target: target, Read: true, Write: true, fifo: fifo} // unless its flags say otherwise
	if b, err := os.ReadFile(filepath.Join(s.root, strconv.Itoa(pid), "fdinfo", strconv.Itoa(fd))); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "flags:"); ok {
				if flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64); err == nil {
					mode := flags & 3 // O_ACCMODE
					e.Read, e.Write = mode != 1, mode != 0
				}
			}
		}
	}
	return e, true
}

// HoldersOutside finds, among the processes under the snapshot's procfs that are not its
// own, a reader and a writer of each of targets (pipes and FIFOs, as End names them), by
// target: the other ends of pipes the snapshot's processes share with the rest of the host.
// A FIFO counts only where it is the very file (device and inode) the tree holds: a path
// names a file in its holder's mount namespace, where any user can mount a tmpfs and make
// a FIFO of their own at the tree's FIFO's path, and such a holder had root's checkpoint
// of another user's job refused (hostile test).
func (s *Snapshot) HoldersOutside(targets map[string]End) map[string]Holders {
	out := map[string]Holders{}
	if len(targets) == 0 {
		return out
	}
	own := map[int]bool{}
	for _, p := range s.procs {
		own[p.PID] = true
	}
	entries, _ := os.ReadDir(s.root)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || own[pid] {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join(s.root, e.Name(), "fd"))
		for _, f := range fds {
			fd, err := strconv.Atoi(f.Name())
			if err != nil {
				continue
			}
			t, err := os.Readlink(filepath.Join(s.root, e.Name(), "fd", f.Name()))
			want, ok := targets[t]
			if err != nil || !ok {
				continue
			}
			end, ok := s.end(pid, fd)
			if !ok || (want.fifo == nil) != (end.fifo == nil) || want.fifo != nil && !os.SameFile(want.fifo, end.fifo) {
				continue
			}
			h := out[end.Target]
			if end.Read && h.Reader == 0 {
				h.Reader = pid
			}
			if end.Write && h.Writer == 0 {
				h.Writer = pid
			}
			out[end.Target] = h
		}
	}
	return out
}

// Holders are a process reading a pipe and one writing it (0: none found).
type Holders struct{ Reader, Writer int }

// CommandOf is the command name (comm) of any process under the snapshot's procfs, its own
// or not; "?" for one gone.
func (s *Snapshot) CommandOf(pid int) string {
	b, err := os.ReadFile(filepath.Join(s.root, strconv.Itoa(pid), "comm"))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// Held is a file a process holds under a path, through a descriptor or a mapping of its
// memory, and what stat says of the file itself (followed through procfs's link to it).
type Held struct {
	Path   string // as procfs shows it, " (deleted)" and all
	FD     int    // the descriptor; -1 for a mapping
	Shared bool   // a mapping the process may write, shared with the file (rw-s)
	Info   os.FileInfo
	FSType int64 // the magic number of the file's file system (statfs)
}

// Links is the held file's link count: how many names it has left; 0 where unknown.
func (h Held) Links() uint64 {
	if st, ok := h.Info.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}

// HeldFiles lists the regular files pid holds open or maps under a path (not anonymous
// memory, sockets or devices) for which want is true, each with its file's stat; one that
// cannot be read (the process or its descriptor gone) is left out. want sees a file before
// its stat is read (a process maps each library several times over), and again with the
// path read beside its stat. Reading a mapping's file needs root, as gpucr's checks run.
func (s *Snapshot) HeldFiles(pid int, want func(Held) bool) []Held {
	dir := filepath.Join(s.root, strconv.Itoa(pid))
	var out []Held
	add := func(link, path string, h Held) {
		h.Path = path
		if !want(h) {
			return
		}
		if h, ok := heldAt(link, h); ok && want(h) {
			out = append(out, h)
		}
	}
	fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
	for _, f := range fds {
		fd, err := strconv.Atoi(f.Name())
		link := filepath.Join(dir, "fd", f.Name())
		if path, lerr := os.Readlink(link); err == nil && lerr == nil && strings.HasPrefix(path, "/") {
			add(link, path, Held{FD: fd})
		}
	}
	mappings, _ := ParseMaps(s.Maps(pid))
	for _, m := range mappings {
		if strings.HasPrefix(m.Path, "/") {
			link := filepath.Join(dir, "map_files", fmt.Sprintf("%x-%x", m.Start, m.End))
			add(link, m.Path, Held{FD: -1, Shared: !m.Private() && m.Writable()})
		}
	}
	return out
}

// heldAt completes h with the regular file link (a /proc/PID/fd or map_files entry) leads
// to, its path, stat and file system all read through one descriptor of gpucr's own, so
// that they describe one file. Read through the link by name, each in turn, a descriptor
// the process closed and reused in between paired a deleted file's path with another
// file's link count, and a job that reuses its descriptors was refused as holding a file
// deleted but linked (crash test: 16 of 300 dry runs, 0 of 600 since). Not ok for a file
// gone or not regular.
func heldAt(link string, h Held) (Held, bool) {
	f, err := os.OpenFile(link, unix.O_PATH, 0)
	if err != nil {
		return h, false
	}
	defer f.Close()
	fd := int(f.Fd())
	// The path first: a file unlinked between the reads is then said deleted with no
	// link left, not deleted and linked.
	if h.Path, err = os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err != nil {
		return h, false
	}
	info, err := f.Stat()
	if err != nil || !info.Mode().IsRegular() {
		return h, false
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return h, false
	}
	h.Info, h.FSType = info, fs.Type
	return h, true
}

// SharesNamespace says whether pid is in the namespace of kind ("ipc", ...) that the
// process reading the snapshot's procfs is in (its "self"); a namespace that cannot be
// read counts as shared.
func (s *Snapshot) SharesNamespace(pid int, kind string) bool {
	theirs, err1 := os.Readlink(filepath.Join(s.root, strconv.Itoa(pid), "ns", kind))
	ours, err2 := os.Readlink(filepath.Join(s.root, "self", "ns", kind))
	return err1 != nil || err2 != nil || theirs == ours
}

// HolderOutside finds, among the processes under the snapshot's procfs that are not its
// own, one holding or mapping any of files, all of them under dir: a file shared with a
// process outside the tree that its checkpoint would carry as its own. It returns the
// file's index in files and the holder, or -1 and 0. Only descriptors and mappings whose
// path is in dir are looked at, so a host of many processes is read quickly.
func (s *Snapshot) HolderOutside(dir string, files []os.FileInfo) (int, int) {
	own := map[int]bool{}
	for _, p := range s.procs {
		own[p.PID] = true
	}
	match := func(link string) int {
		info, err := os.Stat(link)
		if err != nil {
			return -1
		}
		for i, f := range files {
			if os.SameFile(f, info) {
				return i
			}
		}
		return -1
	}
	entries, _ := os.ReadDir(s.root)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || own[pid] {
			continue
		}
		proc := filepath.Join(s.root, e.Name())
		fds, _ := os.ReadDir(filepath.Join(proc, "fd"))
		for _, f := range fds {
			link := filepath.Join(proc, "fd", f.Name())
			if t, err := os.Readlink(link); err == nil && strings.HasPrefix(t, dir+"/") {
				if i := match(link); i >= 0 {
					return i, pid
				}
			}
		}
		b, _ := os.ReadFile(filepath.Join(proc, "maps"))
		mappings, _ := ParseMaps(b)
		for _, m := range mappings {
			if strings.HasPrefix(m.Path, dir+"/") {
				if i := match(filepath.Join(proc, "map_files", fmt.Sprintf("%x-%x", m.Start, m.End))); i >= 0 {
					return i, pid
				}
			}
		}
	}
	return -1, 0
}
