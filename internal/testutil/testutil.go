// Package testutil holds what the tests of several packages share: a process to stand in
// for a workload, waiting for processes to go, prerequisites CI must have, JSON edited in place.
package testutil

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SkipOrFail skips a test whose prerequisite (root, CRIU, a server) is missing, or fails it
// under CI=true: CI has every prerequisite, so a missing one there is a broken setup.
func SkipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("CI lacks a prerequisite: " + why)
	}
	t.Skip(why)
}

// StartSleeper starts a long sleep in a session of its own, a real process for a test to
// lock, dump or claim, and returns once it runs sleep itself (not the fork that execs it).
// When the test ends its whole session is killed and it is reaped.
func StartSleeper(t testing.TB) *exec.Cmd {
	t.Helper()
	return startNamed(t, exec.Command("sleep", "1000"), "sleep", 10*time.Second, "never ran sleep")
}

// startNamed starts cmd in a session of its own and returns once the process is named
// name (its comm), failing the test with what after limit. When the test ends its whole
// session is killed and it is reaped.
func startNamed(t testing.TB, cmd *exec.Cmd, name string, limit time.Duration, what string) *exec.Cmd {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait() // killed: the status says nothing
	})
	comm := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm"
	for deadline := time.Now().Add(limit); ; time.Sleep(time.Millisecond) {
		if b, _ := os.ReadFile(comm); strings.TrimSpace(string(b)) == name {
			return cmd
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d %s", cmd.Process.Pid, what)
		}
	}
}

// StartUnsharedSleeper starts sleep as the first process of new namespaces (unshare's
// flags: "--pid" at least, and "--uts", "--net", ...), in a session of its own inside them
// as CRIU wants, and returns its host PID. The cleanup kills it, if it is still unshare's
// child, and unshare.
func StartUnsharedSleeper(t testing.TB, flags ...string) int {
	t.Helper()
	cmd := exec.Command("unshare", append(append(slices.Clone(flags), "--fork"), "setsid", "sleep", "1000")...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	children := fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid)
	child := func() int {
		b, _ := os.ReadFile(children)
		if f := strings.Fields(string(b)); len(f) == 1 {
			pid, _ := strconv.Atoi(f[0])
			return pid
		}
		return 0
	}
	t.Cleanup(func() {
		if pid := child(); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // killed, or left when its child was: the status says nothing
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if pid := child(); pid > 0 {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(b)) == "sleep" {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("unshare %v never ran sleep", flags)
		}
	}
}

// Alive reports whether pid exists and has not exited (a zombie has).
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !strings.Contains(string(b), ") Z ")
}

// Reap collects every child of the test that has exited, its own or re-parented to it.
func Reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// ExitedWithin reports whether pid exits (a zombie counts) within limit, reaping what was
// re-parented to the test meanwhile.
func ExitedWithin(pid int, limit time.Duration) bool {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		Reap()
		if !Alive(pid) {
			return true
		}
	}
	return false
}

// WaitGone fails the test unless pid exits within 10 s.
func WaitGone(t testing.TB, pid int) {
	t.Helper()
	if !ExitedWithin(pid, 10*time.Second) {
		t.Fatalf("process %d is still alive", pid)
	}
}

// WaitReaped fails the test unless pid is gone and reaped, zombie included, within 10 s:
// the child of a killed tree is re-parented to the test (a subreaper) only once its parent
// is reaped.
func WaitReaped(t testing.TB, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		Reap()
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
			return
		}
	}
	t.Fatalf("process %d was never reaped", pid)
}

// KillAndReap kills a tree's root and its process group (a restored tree's root leads its
// own) and reaps what was re-parented to the test.
func KillAndReap(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 100 && Alive(pid); i++ {
		Reap()
		time.Sleep(10 * time.Millisecond)
	}
	Reap()
}

// EditJSON rewrites the JSON object in path through edit, as a deliberate or malicious edit
// would: nothing else (a seal, a signature) is updated.
func EditJSON(t testing.TB, path string, edit func(map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// WriteFile writes b to path, making its missing parent directories, or fails the test.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// SmallTmpfs mounts a tmpfs of size (as mount takes it: "32m") on a directory of the test's
// own, unmounted when the test ends: a file system to fill. It needs root.
func SmallTmpfs(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "the test mounts a small tmpfs: it needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// StartAt starts name with args at PID pid, through the kernel's last PID (root only), and
// kills it when the test ends: a process that takes a PID another just gave up.
func StartAt(t testing.TB, pid int, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd, err := TryStartAt(t, pid, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TryStartAt is StartAt returning what went wrong instead of failing the test, for a
// goroutine other than the test's own (a hook called from the code under test), where
// t.Fatal must not be called.
func TryStartAt(t testing.TB, pid int, name string, args ...string) (*exec.Cmd, error) {
	// A start time of its own: start times count 10 ms clock ticks, and a process started
	// in the tick its predecessor at pid started in would be that process by PID and start.
	time.Sleep(20 * time.Millisecond)
	for range 50 {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0o644); err != nil {
			return nil, err
		}
		cmd := exec.Command(name, args...)
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		if cmd.Process.Pid == pid {
			t.Cleanup(func() { KillAndReap(pid) })
			return cmd, nil
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	return nil, fmt.Errorf("no process could be started at PID %d", pid)
}
