package testutil

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A sleeper runs sleep itself, in a session of its own, and is gone once its test ends.
func TestStartSleeperRunsAndIsKilledAfterItsTest(t *testing.T) {
	var pid int
	t.Run("sleeper", func(t *testing.T) {
		cmd := StartSleeper(t)
		pid = cmd.Process.Pid
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if err != nil || string(b) != "sleep\n" {
			t.Fatalf("comm = %q, %v; want sleep", b, err)
		}
		if sid, err := unix.Getsid(pid); err != nil || sid != pid {
			t.Fatalf("session %d, %v; want its own (%d)", sid, err, pid)
		}
	})
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Fatalf("sleeper %d outlived its test", pid)
	}
}

// WaitGone counts a zombie as gone; WaitReaped waits for it to be reaped as well, which
// Reap does for a child of the test.
func TestWaitGoneAndReaped(t *testing.T) {
	cmd := StartSleeper(t)
	pid := cmd.Process.Pid
	if !Alive(pid) || ExitedWithin(pid, 20*time.Millisecond) {
		t.Fatal("a running sleeper counts as exited")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	WaitGone(t, pid)
	WaitReaped(t, pid)
	if Alive(pid) {
		t.Fatal("a reaped process counts as alive")
	}
}

// EditJSON changes the fields edit changes and keeps the others.
func TestEditJSON(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.json")
	if err := os.WriteFile(p, []byte(`{"formatVersion": 1, "host": "h"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	EditJSON(t, p, func(m map[string]any) { m["formatVersion"] = 99 })
	b, err := os.ReadFile(p)
	if err != nil || string(b) != `{"formatVersion":99,"host":"h"}` {
		t.Fatalf("edited file %s, %v", b, err)
	}
}
