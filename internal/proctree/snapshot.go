package proctree

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// Stdio is what pid's standard descriptors (0, 1, 2) point at; "" for one closed.
func (s *Snapshot) Stdio(pid int) [3]string {
	var out [3]string
	for fd := range out {
		out[fd], _ = os.Readlink(filepath.Join(s.root, strconv.Itoa(pid), "fd", strconv.Itoa(fd)))
	}
	return out
}

// HoldersOutside finds, among the processes under the snapshot's procfs that are not its
// own, one holding each of targets (descriptor targets, "pipe:[N]"), by target: the
// other end of a pipe the snapshot's processes share with the rest of the host.
func (s *Snapshot) HoldersOutside(targets map[string]bool) map[string]int {
	out := map[string]int{}
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
		files, _ := OpenFiles(s.root, pid)
		for _, f := range files {
			if _, seen := out[f]; targets[f] && !seen {
				out[f] = pid
			}
		}
	}
	return out
}

// CommandOf is the command name (comm) of any process under the snapshot's procfs, its own
// or not; "?" for one gone.
func (s *Snapshot) CommandOf(pid int) string {
	b, err := os.ReadFile(filepath.Join(s.root, strconv.Itoa(pid), "comm"))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}
