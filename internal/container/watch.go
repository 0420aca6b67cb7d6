package container

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
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
