// Package proctree reads a live process tree from /proc: which processes a checkpoint of
// a root PID takes, so the engine can find those holding GPU state before CRIU freezes them.
package proctree

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// ErrNoProcess means the PID does not name a running process.
var ErrNoProcess = errors.New("no such process")

// Process is one live process.
type Process struct {
	PID     int
	PPID    int
	Pgrp    int // process group ID
	Session int // session ID
	Command string
	Threads int
	// State is /proc/PID/stat's one letter: R running, S and D asleep, T stopped by a
	// signal, t stopped by its tracer, Z a zombie.
	State  byte
	Zombie bool // exited, its resources freed, waiting for its parent to reap it
	// Kernel marks a kernel thread (PF_KTHREAD): it has no user memory, nothing to dump.
	Kernel bool
	// Start is when the process started, in clock ticks since boot: with the PID it names
	// one process for good, so a PID reused by another is never taken for it.
	Start uint64
}

// Tree returns root and all its descendants, root first, then by PID.
func Tree(root int) ([]Process, error) {
	all, err := scan()
	if err != nil {
		return nil, err
	}
	byPID := map[int]Process{}
	children := map[int][]int{}
	for _, p := range all {
		byPID[p.PID] = p
		children[p.PPID] = append(children[p.PPID], p.PID)
	}
	r, ok := byPID[root]
	if !ok {
		return nil, fmt.Errorf("process %d: %w", root, ErrNoProcess)
	}
	tree := []Process{r}
	queue := []int{root}
	for len(queue) > 0 {
		kids := children[queue[0]]
		queue = queue[1:]
		sort.Ints(kids)
		for _, k := range kids {
			tree = append(tree, byPID[k])
			queue = append(queue, k)
		}
	}
	return tree, nil
}

// All returns every process on the host.
func All() ([]Process, error) { return scan() }

// Read returns one process, or ErrNoProcess.
func Read(pid int) (Process, error) {
	p, err := read(pid)
	if errors.Is(err, os.ErrNotExist) {
		return Process{}, fmt.Errorf("process %d: %w", pid, ErrNoProcess)
	}
	return p, err
}

func scan() ([]Process, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, err := read(pid)
		if err != nil {
			continue // exited while we looked
		}
		out = append(out, p)
	}
	return out, nil
}

// pfKthread is the kernel's PF_KTHREAD flag (include/linux/sched.h).
const pfKthread = 0x00200000

// read parses /proc/PID/stat; the command sits in parentheses and may itself hold them.
func read(pid int) (Process, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return Process{}, err
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return Process{}, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[end+1:])
	// After the command: state(0) ppid(1) pgrp(2) session(3) tty(4) tpgid(5) flags(6) ...
	// num_threads(17) itrealvalue(18) starttime(19).
	if len(fields) < 20 {
		return Process{}, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(fields))
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return Process{}, fmt.Errorf("parse /proc/%d/stat ppid: %w", pid, err)
	}
	pgrp, err := strconv.Atoi(fields[2])
	if err != nil {
		return Process{}, fmt.Errorf("parse /proc/%d/stat pgrp: %w", pid, err)
	}
	session, err := strconv.Atoi(fields[3])
	if err != nil {
		return Process{}, fmt.Errorf("parse /proc/%d/stat session: %w", pid, err)
	}
	threads, err := strconv.Atoi(fields[17])
	if err != nil {
		return Process{}, fmt.Errorf("parse /proc/%d/stat threads: %w", pid, err)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return Process{}, fmt.Errorf("parse /proc/%d/stat starttime: %w", pid, err)
	}
	flags, err := strconv.ParseUint(fields[6], 10, 64)
	if err != nil {
		return Process{}, fmt.Errorf("parse /proc/%d/stat flags: %w", pid, err)
	}
	return Process{PID: pid, PPID: ppid, Pgrp: pgrp, Session: session, Command: s[open+1 : end], Threads: threads,
		State: fields[0][0], Zombie: fields[0] == "Z", Kernel: flags&pfKthread != 0, Start: start}, nil
}

// Children lists the children of process pid, made by any of its threads; none if pid is
// gone. Cheaper than Tree for a process watched again and again.
func Children(pid int) []int {
	lists, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, l := range lists {
		b, _ := os.ReadFile(l)
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// PIDs lists the PIDs of ps in order.
func PIDs(ps []Process) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.PID
	}
	return out
}

// OpenFiles returns what each open descriptor of pid points at ("/dev/kfd",
// "anon_inode:[io_uring]", ...), read under procRoot ("/proc" outside tests). A process
// that is gone has none; descriptors closed while they are read are skipped.
func OpenFiles(procRoot string, pid int) ([]string, error) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open files of pid %d: %w", pid, err)
	}
	var out []string
	for _, e := range entries {
		if t, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			out = append(out, t)
		}
	}
	return out, nil
}

// Holding returns the processes other than gpucr itself with a descriptor open on dir or
// anything beneath it. A descriptor names its file by a path, not by where it is: in a
// mount namespace of their own users can make a file at any path they like (a tmpfs, or a
// bind mount of a directory of theirs, at a restore directory's name: hostile tests and a
// review did), and a descriptor of it passed to a process of gpucr's namespace shows that
// path from the mount's own root. So a descriptor counts only if its file is the very file
// (device and inode) at its path in gpucr's namespace; once dir is gone, only a process of
// gpucr's mount namespace counts, by the path alone.
func Holding(dir string) ([]int, error) {
	all, err := scan()
	if err != nil {
		return nil, err
	}
	_, statErr := os.Lstat(dir)
	homeKnown := statErr == nil
	var pids []int
	for _, p := range all {
		if p.PID == os.Getpid() {
			continue
		}
		other, err := OwnNamespace(p.PID, "mnt")
		if err != nil {
			continue // gone
		}
		fdDir := filepath.Join("/proc", strconv.Itoa(p.PID), "fd")
		entries, _ := os.ReadDir(fdDir)
		for _, e := range entries {
			f, err := os.Readlink(filepath.Join(fdDir, e.Name()))
			if err != nil || f != dir && !strings.HasPrefix(f, dir+"/") {
				continue
			}
			if homeKnown && !sameFile(filepath.Join(fdDir, e.Name()), f) || !homeKnown && other {
				continue
			}
			pids = append(pids, p.PID)
			break
		}
	}
	return pids, nil
}

// sameFile says whether the descriptor at fdPath (/proc/PID/fd/N) is the file at path.
func sameFile(fdPath, path string) bool {
	var held, here syscall.Stat_t
	return syscall.Stat(fdPath, &held) == nil && syscall.Lstat(path, &here) == nil && held.Dev == here.Dev && held.Ino == here.Ino
}

// Tracer returns the PID of the process tracing pid (CRIU, while it freezes or restores
// it), or 0.
func Tracer(pid int) (int, error) { return statusNumber(pid, "TracerPid:") }

// ThreadGroup returns the process (thread group) that the thread tid belongs to; tid may
// be any thread's ID, which /proc does not list but opens.
func ThreadGroup(tid int) (int, error) { return statusNumber(tid, "Tgid:") }

// statusNumber reads the number after key in /proc/PID/status.
func statusNumber(pid int, key string) (int, error) {
	v, err := statusField(pid, key)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

// BlockedSignals is the mask of signals pid's thread group leader blocks (SigBlk: bit n-1
// for signal n).
func BlockedSignals(pid int) (uint64, error) {
	v, err := statusField(pid, "SigBlk:")
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(v, 16, 64)
}

// statusField is the value of the line of /proc/PID/status that starts with key.
func statusField(pid int, key string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("process %d: %w", pid, ErrNoProcess)
	}
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no %s in /proc/%d/status", strings.TrimSuffix(key, ":"), pid)
}

// Same reports whether pid is still the process that started at start.
func Same(pid int, start uint64) bool {
	p, err := read(pid)
	return err == nil && !p.Zombie && p.Start == start
}
