package proctree

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// InnerPID is pid as its own PID namespace numbers it: the last NSpid field of its status.
// Images of a tree with a PID namespace of its own (a container's, or one that unshare
// made) record these, because a restore gives the tree new host PIDs and keeps these.
func InnerPID(pid int) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read process %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				break
			}
			return strconv.Atoi(fields[len(fields)-1])
		}
	}
	return 0, fmt.Errorf("process %d: no NSpid in its status", pid)
}

// HostPIDs maps each process of the tree rooted at host PID root from its InnerPID to its
// host PID.
func HostPIDs(root int) (map[int]int, error) {
	tree, err := Tree(root)
	if err != nil {
		return nil, err
	}
	m := make(map[int]int, len(tree))
	for _, p := range tree {
		in, err := InnerPID(p.PID)
		if errors.Is(err, ErrNoProcess) || errors.Is(err, fs.ErrNotExist) {
			continue // exited since the tree was read: it holds nothing to map
		}
		if err != nil {
			return nil, err
		}
		m[in] = p.PID
	}
	return m, nil
}

// procPIDInitIno is the inode number of the host's (the initial) PID namespace, the same on
// every Linux since 3.8 (PROC_PID_INIT_INO, include/linux/proc_ns.h).
const procPIDInitIno = 0xEFFFFFFC

// InHostPIDNamespace says whether gpucr runs in the host's PID namespace, where /proc shows
// every process of the machine: in a container's own, the host's are not there to see.
func InHostPIDNamespace() (bool, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/pid", &st); err != nil {
		return false, fmt.Errorf("read gpucr's own PID namespace: %w", err)
	}
	return st.Ino == procPIDInitIno, nil
}

// SameNamespace says whether processes a and b are in one namespace of kind.
func SameNamespace(a, b int, kind string) (bool, error) {
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/%s", a, kind), &sa); err != nil {
		return false, fmt.Errorf("read process %d's %s namespace: %w", a, kind, err)
	}
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/%s", b, kind), &sb); err != nil {
		return false, fmt.Errorf("read process %d's %s namespace: %w", b, kind, err)
	}
	return sa.Ino == sb.Ino && sa.Dev == sb.Dev, nil
}

// OwnNamespace says whether process pid is in another namespace of kind ("pid", "mnt",
// "net", ...) than the calling process.
func OwnNamespace(pid int, kind string) (bool, error) {
	var theirs, ours syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), &theirs); err != nil {
		return false, fmt.Errorf("read process %d's %s namespace: %w", pid, kind, err)
	}
	if err := syscall.Stat("/proc/self/ns/"+kind, &ours); err != nil {
		return false, fmt.Errorf("read gpucr's own %s namespace: %w", kind, err)
	}
	return theirs.Ino != ours.Ino || theirs.Dev != ours.Dev, nil
}
