package engine

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// startAt starts cmd and returns its PID, the program /proc names for it, and a channel
// closed with its wait status once it exits; it waits until the program is the last cmd
// execs and, with blocked, until cmd blocks the signals a task in CRIU's restore blocks.
func startAt(t *testing.T, cmd *exec.Cmd, blocked bool) (int, string, <-chan error) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		testutil.SkipOrFail(t, err.Error())
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pid := cmd.Process.Pid
	var exe string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		// a shim (pyenv's python3) execs the program itself: wait until it stops changing
		if e, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && e == exe && inCRIUsRestore(pid) == blocked {
			break
		} else if err == nil {
			exe = e
		}
	}
	return pid, exe, done
}

// An image names a PID and the program it ran there; a process another user started at
// that PID after CRIU started (it took the PID, and CRIU failed to fork there), running
// that program, is not the restore's, and the rollback leaves it alone. It was SIGKILLed
// by root's gpucr (hostile test: `Can't fork for 30000: File exists`, and the bystander's
// sleep at 30000 killed).
func TestKillForksSparesABystanderRunningTheImagesProgram(t *testing.T) {
	pid, exe, done := startAt(t, exec.Command("sleep", "30"), false)
	opened := map[int]*criuimg.Opened{pid: {Exe: exe}}
	killForks([]txn.Proc{{PID: pid}}, "/proc/self/exe", 0, opened)
	select {
	case err := <-done:
		t.Fatalf("a bystander at an image PID running the image's program was killed: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
}

// A task CRIU took far (its program set) and left in its restorer, every signal but
// SIGCHLD blocked, still goes.
func TestKillForksKillsATaskLeftInCRIUsRestorer(t *testing.T) {
	cmd := exec.Command("python3", "-c", "import signal, time\n"+
		"signal.pthread_sigmask(signal.SIG_BLOCK, set(range(1, 32)) - {9, 17, 19})\n"+
		"time.sleep(30)\n")
	pid, exe, done := startAt(t, cmd, true)
	if !inCRIUsRestore(pid) {
		testutil.SkipOrFail(t, "python3 could not block the signals")
	}
	killForks([]txn.Proc{{PID: pid}}, "/proc/self/exe", 0, map[int]*criuimg.Opened{pid: {Exe: exe}})
	select {
	case err := <-done:
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("the task ended otherwise: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a task left in CRIU's restorer was not killed")
	}
}
