package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/testutil"
)

// These tests run the real gpucr binary against real CRIU on real process trees. They need
// root and CRIU >= 4.1 (make deps); under CI=true a missing prerequisite fails them.

var bin struct{ gpucr, counter string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gpucr-test-bin-")
	if err != nil {
		panic(err)
	}
	_ = os.Chmod(dir, 0o755) // the not-root test runs the binary as nobody
	bin.gpucr, bin.counter = filepath.Join(dir, "gpucr"), filepath.Join(dir, "counter")
	for out, pkg := range map[string]string{bin.gpucr: ".", bin.counter: "../../test/workloads/counter"} {
		build := exec.Command("go", "build", "-o", out, pkg)
		if out == bin.counter {
			build.Env = append(os.Environ(), "CGO_ENABLED=0") // static: it also runs in containers
		}
		if b, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, b)
			os.Exit(1)
		}
	}
	// Restored trees are re-parented to the nearest subreaper: make that us, so the tests
	// can reap what they restore instead of leaving zombies that hold PIDs.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// needCRIU skips (or under CI fails) when this host cannot run CRIU.
func needCRIU(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	} else if _, code := gpucr(t, "check"); code != 0 {
		why = "gpucr check says the host is not ready (run make deps)"
	}
	if why != "" {
		testutil.SkipOrFail(t, why)
	}
}

// gpucr runs the binary and returns its stdout+stderr and exit code.
func gpucr(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin.gpucr, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("run gpucr: %v", err)
	}
	return out.String(), 0
}

func mustGpucr(t *testing.T, args ...string) string {
	t.Helper()
	out, code := gpucr(t, args...)
	if code != 0 {
		t.Fatalf("gpucr %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// workload is a running counter tree.
type workload struct {
	dir string
	pid int
	cmd *exec.Cmd
}

// startCounter starts the counter detached from any terminal and waits for its first count.
func startCounter(t *testing.T, args ...string) *workload {
	t.Helper()
	w := &workload{dir: t.TempDir()}
	w.cmd = exec.Command(bin.counter, append([]string{"-dir", w.dir, "-tick", "20ms"}, args...)...)
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

// oneLineWith reports whether gpucr's output is the one line a refusal must be, naming want.
func oneLineWith(out, want string) bool {
	return strings.Contains(out, want) && !strings.Contains(strings.TrimSpace(out), "\n")
}
