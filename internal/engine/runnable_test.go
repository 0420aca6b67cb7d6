package engine

import (
	"log/slog"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/testutil"
)

// A GPU process stopped after the check that it runs held the driver's lock, and gpucr,
// for as long as it stayed stopped, without a word: the wait names it, once.
func TestLockWaitNamesAStoppedGPUProcess(t *testing.T) {
	sleeper := testutil.StartSleeper(t)
	pid := sleeper.Process.Pid
	var out testutil.LockedBuffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	done := warnWhileStopped(GPUSet{{Process: gpu.Process{PID: pid}}}, log, 20*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	if s := out.String(); s != "" {
		t.Fatalf("a running process was named: %s", s)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "pid="+strconv.Itoa(pid)) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	done()
	s := out.String()
	if !strings.Contains(s, "pid="+strconv.Itoa(pid)) || !strings.Contains(s, "kill -CONT") {
		t.Fatalf("log %q: want the stopped process named, with what to do", s)
	}
	if n := strings.Count(s, "pid="+strconv.Itoa(pid)); n != 1 {
		t.Errorf("named %d times, want once", n)
	}
}
