package container

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// watchFD is where a watcher finds the pidfd of the CRIU it waits for.
const watchFD = 3

// StartWatcher starts exe with args, detached in its own session, holding a pidfd of
// criuPID as file descriptor 3, and locks after it, which it holds for as long as it
// lives. Opening the pidfd here, while CRIU waits for this script, means the watcher waits
// for that CRIU and no other process that reuses its PID.
func StartWatcher(exe string, args []string, criuPID int, locks []*os.File) error {
	fd, err := unix.PidfdOpen(criuPID, 0)
	if err != nil {
		return fmt.Errorf("pidfd of CRIU %d: %w", criuPID, err)
	}
	pidfd := os.NewFile(uintptr(fd), "criu-pidfd")
	defer pidfd.Close()
	cmd := exec.Command(exe, args...)
	cmd.ExtraFiles = append([]*os.File{pidfd}, locks...) // it holds the locks while it lives
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", exe, err)
	}
	return cmd.Process.Release()
}

// WaitCRIU blocks until the process behind the inherited pidfd has exited.
func WaitCRIU() error {
	fds := []unix.PollFd{{Fd: watchFD, Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for CRIU to exit: %w", err)
		}
		if fds[0].Revents&(unix.POLLNVAL) != 0 {
			return errors.New("wait for CRIU to exit: no pidfd at descriptor 3")
		}
		return nil
	}
}

// LeaveCallersCgroups moves this process to the root of every cgroup hierarchy it can see:
// a rollback watcher outlives the runc that started it, and a caller that cleans up its
// cgroup when runc returns (a systemd unit, KillMode=control-group; a CI runner) killed it
// before it resumed the GPUs, leaving a job that runc reported dumped and running stopped
// on its GPU (hostile test). It returns the hierarchies it could not leave.
func LeaveCallersCgroups() []error {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return []error{err}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []error{err}
	}
	self := []byte(strconv.Itoa(os.Getpid()))
	var errs []error
	for _, root := range cgroupRoots(string(own), string(mounts)) {
		if err := os.WriteFile(filepath.Join(root, "cgroup.procs"), self, 0); err != nil {
			errs = append(errs, fmt.Errorf("leave the cgroup below %s: %w", root, err))
		}
	}
	return errs
}

// cgroupRoots are the mount points of the cgroup hierarchies whose cgroup, as
// /proc/self/cgroup lists them (own), is not the root of what is mounted: cgroup2's
// ("0::PATH") and each v1 hierarchy's, by its controllers or name=.
func cgroupRoots(own, mountinfo string) []string {
	below := map[string]bool{} // "" for cgroup2, else a v1 hierarchy's options
	for _, l := range strings.Split(own, "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 && f[2] != "/" {
			below[f[1]] = true
		}
	}
	var out []string
	for _, l := range strings.Split(mountinfo, "\n") {
		left, right, ok := strings.Cut(l, " - ")
		mf, rf := strings.Fields(left), strings.Fields(right)
		if !ok || len(mf) < 5 || len(rf) < 3 || mf[3] != "/" {
			continue // not a hierarchy mounted from its root
		}
		switch rf[0] {
		case "cgroup2":
			if below[""] {
				out = append(out, mf[4])
			}
		case "cgroup":
			for key := range below {
				if key != "" && v1Has(rf[2], key) {
					out = append(out, mf[4])
					break
				}
			}
		}
	}
	return out
}

// v1Has says whether a v1 cgroup mount's options hold each of a hierarchy's controllers
// (or its name=), as /proc/self/cgroup lists them comma-separated.
func v1Has(options, hierarchy string) bool {
	opts := strings.Split(options, ",")
	for _, c := range strings.Split(hierarchy, ",") {
		if !slices.Contains(opts, c) {
			return false
		}
	}
	return true
}

// ReleaseInheritedLocks lets go of the n locks a watcher inherited after the pidfd
// (descriptors 4 on), removing each lock file while it is still the one held, as a lock's
// release does: left, a file per process per dump stayed behind, and the action script,
// which starts gpucr only for a tree with a GPU device open or a lock file, started it for
// every later dump of those PIDs.
func ReleaseInheritedLocks(n int) {
	for fd := watchFD + 1; fd < watchFD+1+n; fd++ {
		path, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		var held, named unix.Stat_t
		if err == nil && unix.Fstat(fd, &held) == nil && unix.Stat(path, &named) == nil && held.Ino == named.Ino && held.Dev == named.Dev {
			_ = os.Remove(path)
		}
		_ = unix.Close(fd)
	}
}
