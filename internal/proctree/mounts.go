package proctree

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of a mountinfo file: a file system mounted at Dir, showing its Root.
type Mount struct {
	Root    string // the directory of the file system that is mounted ("/" for the whole)
	Dir     string // where it is mounted
	FSType  string // "proc", "tmpfs", "cgroup2"...
	Options string // the file system's own options ("rw,freezer")
}

// ReadMounts reads a mountinfo file (/proc/self/mountinfo: the mounts of this process's
// mount namespace), in its order.
func ReadMounts(path string) ([]Mount, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 3 {
			continue
		}
		out = append(out, Mount{Root: unescapeMount(a[3]), Dir: unescapeMount(a[4]), FSType: b[0], Options: b[2]})
	}
	return out, sc.Err()
}

// ProcMounts lists where procfs is mounted in this process's mount namespace: /proc, and
// any other (a chroot's), where a path names a process by its PID just the same.
func ProcMounts() ([]string, error) {
	ms, err := ReadMounts("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		// A whole procfs only: systemd and container engines bind-mount parts of one
		// (/proc/sys, /proc/irq), whose first component is no PID.
		if m.FSType == "proc" && m.Root == "/" {
			out = append(out, m.Dir)
		}
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
