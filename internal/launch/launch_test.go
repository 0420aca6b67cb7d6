package launch

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// When a rank fails the others are told to stop, and one that ignores it is killed after
// the grace: a hostile test's rank that trapped SIGTERM held the launcher for good.
func TestAFailedRankStopsTheOthers(t *testing.T) {
	defer func(d time.Duration) { stopGrace = d }(stopGrace)
	stopGrace = 300 * time.Millisecond
	script := `trap '' TERM; if [ "$RANK" = 0 ]; then sleep 0.2; exit 3; fi; exec sleep 60`
	start := time.Now()
	err := Run(context.Background(), Job{NProc: 2, Command: []string{"sh", "-c", script}, Stdout: io.Discard, Stderr: io.Discard})
	var failed *RankError
	if !errors.As(err, &failed) || failed.Rank != 0 || failed.ExitCode() != 3 || err.Error() != "rank 0 exited with code 3" {
		t.Fatalf("Run = %v, want rank 0's exit code 3", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Run took %v: the rank that ignored SIGTERM was not killed", took)
	}
}

// The rank that failed first is the job's failure, not a rank stopped after it (killed by
// the launcher's SIGTERM, whose exit code is -1), and a rank killed by a signal is told as
// such, its status 128 + the signal as a shell gives: a hostile test's gpucr run exited 255
// and said nothing.
func TestTheFirstFailureIsTheJobs(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   string
		code   int
	}{
		{`if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 60`, "rank 1 exited with code 3", 3},
		{`if [ "$RANK" = 1 ]; then kill -KILL $$; fi; exec sleep 60`, "rank 1 was killed by SIGKILL (signal 9)", 137},
	} {
		err := Run(context.Background(), Job{NProc: 2, Command: []string{"sh", "-c", tc.script}, Stdout: io.Discard, Stderr: io.Discard})
		var failed *RankError
		if !errors.As(err, &failed) || err.Error() != tc.want || failed.ExitCode() != tc.code {
			t.Errorf("Run = %v, want %q (status %d)", err, tc.want, tc.code)
		}
	}
}

// A rank that cannot start fails the job at once, and the ranks already started are killed,
// none left running without the others.
func TestARankThatCannotStartTakesTheStartedOnesWithIt(t *testing.T) {
	defer func(f func(*exec.Cmd) error) { startRank = f }(startRank)
	var started []*exec.Cmd
	startRank = func(c *exec.Cmd) error {
		if len(started) == 2 {
			return errors.New("no more processes")
		}
		started = append(started, c)
		return c.Start()
	}
	err := Run(context.Background(), Job{NProc: 3, Command: []string{"sleep", "60"}, Stdout: io.Discard, Stderr: io.Discard})
	if err == nil || !strings.Contains(err.Error(), "launch rank 2: no more processes") {
		t.Fatalf("Run = %v, want rank 2's start failure", err)
	}
	for i, c := range started {
		if c.ProcessState == nil {
			t.Errorf("rank %d was left running", i)
		} else if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Errorf("rank %d: %v, want it killed", i, c.ProcessState)
		}
	}
}

// What a rank started stops with it: a rank that is a script with a child (a wrapper, a
// data loader) left the child running after the job ended (hostile test). Rank 0 fails;
// every rank's child is gone once Run returns.
func TestARanksChildrenStopWithTheJob(t *testing.T) {
	dir := t.TempDir()
	script := `sleep 60 & echo $! > ` + dir + `/child.$RANK; if [ "$RANK" = 0 ]; then sleep 0.3; exit 3; fi; wait`
	// Files, as a terminal is: a pipe to copy from would keep Wait for as long as a child
	// holds it.
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	err = Run(context.Background(), Job{NProc: 3, Command: []string{"sh", "-c", script}, Stdout: null, Stderr: null})
	var failed *RankError
	if !errors.As(err, &failed) || failed.Rank != 0 {
		t.Fatalf("Run = %v, want rank 0's failure", err)
	}
	childrenGone(t, dir, 3)
}

// What the ranks started goes when they all end well too: workers left after a successful
// job held their GPUs (hostile test).
func TestARanksChildrenStopWithASuccessfulJob(t *testing.T) {
	defer func(d time.Duration) { stopGrace = d }(stopGrace)
	stopGrace = 300 * time.Millisecond
	dir := t.TempDir()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	script := `sleep 60 & echo $! > ` + dir + `/child.$RANK; exit 0`
	if err := Run(context.Background(), Job{NProc: 2, Command: []string{"sh", "-c", script}, Stdout: null, Stderr: null}); err != nil {
		t.Fatal(err)
	}
	childrenGone(t, dir, 2)
}

// A worker that ignores SIGTERM is killed before the launcher returns: the SIGKILL its
// timer would send later never came once gpucr run had exited (review).
func TestAWorkerIgnoringSIGTERMGoesBeforeTheJobReturns(t *testing.T) {
	defer func(d time.Duration) { stopGrace = d }(stopGrace)
	stopGrace = 2 * time.Second
	dir := t.TempDir()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	script := `sh -c 'trap "" TERM; exec sleep 60' & echo $! > ` + dir + `/child.$RANK; exit 0`
	if err := Run(context.Background(), Job{NProc: 1, Command: []string{"sh", "-c", script}, Stdout: null, Stderr: null}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "child.0"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if !exitedWithin(pid, 200*time.Millisecond) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the worker %d that ignores SIGTERM runs on after the job returned", pid)
	}
}

// childrenGone fails t unless the child each of ranks ranks wrote into dir is gone.
func childrenGone(t *testing.T, dir string, ranks int) {
	t.Helper()
	for rank := range ranks {
		b, err := os.ReadFile(filepath.Join(dir, "child."+strconv.Itoa(rank)))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if !exitedWithin(pid, 5*time.Second) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("rank %d's child %d runs on after the job", rank, pid)
		}
	}
}

// exitedWithin says whether pid is gone (or a zombie) within d.
func exitedWithin(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
			return true
		}
	}
	return false
}

// A reaped rank's group number is free once its last process exits: another process given
// it as its PID, leading a group of its own, got the job's SIGTERM (hostile test, with the
// PID forced). Such a group is left alone; one where the rank's children live on is not.
func TestSignalsSpareAGroupThatTookAReapedRanksNumber(t *testing.T) {
	stranger := exec.Command("sleep", "60")
	stranger.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // leads group = its PID
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stranger.Process.Kill(); _ = stranger.Wait() }()
	// A rank's wrapper that started a child in its group and exited: the child lives on.
	orphaned := exec.Command("sh", "-c", "sleep 60 </dev/null >/dev/null 2>&1 & echo $!")
	orphaned.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := orphaned.Output()
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	defer func() { _ = syscall.Kill(child, syscall.SIGKILL) }()

	ranks := []*exec.Cmd{{Process: stranger.Process}, orphaned}
	reaped := make([]atomic.Bool, len(ranks))
	reaped[0].Store(true) // the rank that had the stranger's number is gone
	reaped[1].Store(true)
	signalAll(ranks, reaped, syscall.SIGTERM)
	if exitedWithin(stranger.Process.Pid, 500*time.Millisecond) {
		t.Error("a process that took a reaped rank's number was signalled")
	}
	if !exitedWithin(child, 5*time.Second) {
		t.Error("a reaped rank's child, in its group, was not signalled")
	}
}
