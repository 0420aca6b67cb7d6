package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testutil"
)

// workload is a running counter tree (test/workloads/counter): it counts into files of dir
// and re-checks its memory pattern on SIGUSR1.
type workload struct {
	dir string
	pid int
	cmd *exec.Cmd
}

// startCounter starts the counter detached from any terminal and waits for its first count.
func startCounter(t *testing.T, args ...string) *workload {
	t.Helper()
	return startCounterOf(t, bin.counter, args...)
}

// startCounterOf starts the counter from the program at prog.
func startCounterOf(t *testing.T, prog string, args ...string) *workload {
	t.Helper()
	w := &workload{dir: t.TempDir()}
	w.cmd = exec.Command(prog, append([]string{"-dir", w.dir, "-tick", "20ms"}, args...)...)
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.pid = w.cmd.Process.Pid
	go w.cmd.Wait() //nolint:errcheck // reaps the original when CRIU kills it
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	w.waitCount(t, 1)
	return w
}

func (w *workload) read(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(w.dir, name))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.Fields(string(b) + " 0")[0])
	return n
}

// waitCount waits until the counter's count reaches at least n.
func (w *workload) waitCount(t *testing.T, n int) int {
	t.Helper()
	return w.waitFile(t, "count", n)
}

func (w *workload) waitFile(t *testing.T, name string, n int) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if c := w.read(t, name); c >= n {
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never reached %d (now %d)", name, n, w.read(t, name))
	return 0
}

// verify asks the counter to re-check its memory pattern and returns its verdict.
func (w *workload) verify(t *testing.T, pid int) string {
	t.Helper()
	os.Remove(filepath.Join(w.dir, "verify"))
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatalf("signal %d: %v", pid, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(filepath.Join(w.dir, "verify")); err == nil {
			return strings.Fields(string(b))[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("counter never answered the verify signal")
	return ""
}

// checkRunsOn fails t unless the counter, after what, is alive, counts on and has its
// memory pattern intact.
func (w *workload) checkRunsOn(t *testing.T, what string) {
	t.Helper()
	if !testutil.Alive(w.pid) {
		t.Fatalf("the workload died after %s", what)
	}
	w.waitCount(t, w.read(t, "count")+3)
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after %s: %s", what, v)
	}
}

// restoreJSON runs restore --json with env and args, returns what it reported, and kills
// and reaps the restored tree when the test ends.
func restoreJSON(t *testing.T, env []string, args ...string) restoreDoc {
	t.Helper()
	var r restoreDoc
	decode(t, mustGpucrEnv(t, env, append([]string{"restore", "--json"}, args...)...), &r)
	if r.RootPID <= 0 {
		t.Fatalf("restore reported root PID %d", r.RootPID)
	}
	t.Cleanup(func() { testutil.KillAndReap(r.RootPID) })
	return r
}

// restore restores the image at dir and returns the restored root's PID.
func restore(t *testing.T, dir string) int {
	t.Helper()
	return restoreJSON(t, nil, "-D", dir).RootPID
}

// goOnThenKill lets w, just checkpointed and left running, count more times, then kills it,
// and returns its count at the checkpoint (as read when called).
func (w *workload) goOnThenKill(t *testing.T, more int) int {
	t.Helper()
	at := w.read(t, "count")
	w.waitCount(t, at+more)
	testutil.KillAndReap(w.pid)
	testutil.WaitGone(t, w.pid)
	return at
}
