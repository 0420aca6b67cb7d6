package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/testutil"
)

// A periodic timerfd that expired unread while the tree was frozen reads it_value (0, 0) in
// fdinfo, which CRIU dumps as is and restores with timerfd_settime: the restored timer was
// disarmed, and a loop reading it (a 1 s tick) read its pending tick and then blocked for
// good, after a checkpoint and restore that both said they succeeded (hostile test: every
// second checkpoint, gpucr's network lock holding the tree frozen half a second). Here the
// process holding the timer never reads it, so it is always expired at the dump; once
// restored, the timer must fire again after its pending ticks are read.
func TestPeriodicTimerfdFiresAfterRestore(t *testing.T) {
	needCRIU(t)
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC)
	if err != nil {
		testutil.SkipOrFail(t, "timerfd_create: "+err.Error())
	}
	every := unix.NsecToTimespec(int64(50 * time.Millisecond))
	if err := unix.TimerfdSettime(tfd, 0, &unix.ItimerSpec{Interval: every, Value: every}, nil); err != nil {
		t.Fatal(err)
	}
	pid := sleeperHolding(t, os.NewFile(uintptr(tfd), "timerfd"))
	time.Sleep(200 * time.Millisecond) // expired, unread

	img := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(pid), "-D", img)
	testutil.WaitGone(t, pid)
	restored := restore(t, img)

	pidfd, err := unix.PidfdOpen(restored, 0)
	if err != nil {
		testutil.SkipOrFail(t, "pidfd_open: "+err.Error())
	}
	defer unix.Close(pidfd)
	timer, err := unix.PidfdGetfd(pidfd, 3, 0)
	if err != nil {
		t.Fatalf("the restored process's timerfd: %v", err)
	}
	defer unix.Close(timer)
	if err := unix.SetNonblock(timer, true); err != nil {
		t.Fatal(err)
	}
	var ticks [8]byte
	_, _ = unix.Read(timer, ticks[:]) // the ticks pending since the dump, if any
	fds := []unix.PollFd{{Fd: int32(timer), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 2000)
	for err == unix.EINTR {
		n, err = unix.Poll(fds, 2000)
	}
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		info, _ := os.ReadFile("/proc/" + strconv.Itoa(restored) + "/fdinfo/3")
		t.Fatalf("the restored 50 ms timerfd did not fire in 2 s: it was restored disarmed\n%s", info)
	}
}
