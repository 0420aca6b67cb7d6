package criu

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pgidOfCRIU runs op through a Driver whose "CRIU" only writes down its process group and
// exits, and returns that group.
func pgidOfCRIU(t *testing.T, op func(d *Driver, dir string) error) int {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "pgid")
	script := filepath.Join(dir, "criu")
	// Field 5 of /proc/PID/stat is the process group; the command is "sh", no spaces.
	body := "#!/bin/sh\ncut -d' ' -f5 /proc/$$/stat > " + out + "\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = op(&Driver{Path: script}, dir) // the fake hangs up without answering: an error
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the fake CRIU did not run: %v", err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pgid
}

// A dump's CRIU holds the tree, and at times runs code it injected in the tree's tasks: a
// signal meant for gpucr's process group (timeout -s KILL, kill -9 -PGID, a service
// manager's stop, the terminal's Ctrl-\ or Ctrl-Z) must not reach it there, or a task it
// leaves at its injected trap dies of SIGTRAP once released: the workload gone, no
// checkpoint. It runs in a process group of its own. A restore's CRIU stays in gpucr's:
// CRIU gives a restored shell job its own process group.
func TestCRIURunsInAProcessGroupOfItsOwn(t *testing.T) {
	ours := unix.Getpgrp()
	dump := pgidOfCRIU(t, func(d *Driver, dir string) error {
		return d.Dump(context.Background(), DumpRequest{PID: 1, ImagesDir: dir, WorkDir: dir}, nil)
	})
	if dump == ours {
		t.Errorf("a dump's CRIU is in gpucr's process group %d: a kill of the group takes it mid-dump", ours)
	}
	// A restore's CRIU killed with the group after the gate left the tasks in its restorer
	// for good (hostile test): its own group too, but for a shell job's.
	restore := pgidOfCRIU(t, func(d *Driver, dir string) error {
		_, err := d.Restore(context.Background(), RestoreRequest{ImagesDir: dir, WorkDir: dir}, nil)
		return err
	})
	if restore == ours {
		t.Errorf("a restore's CRIU is in gpucr's process group %d: a kill of the group takes it mid-restore", ours)
	}
	shell := pgidOfCRIU(t, func(d *Driver, dir string) error {
		_, err := d.Restore(context.Background(), RestoreRequest{ImagesDir: dir, WorkDir: dir, Options: Options{Flags: Flags{ShellJob: true}}}, nil)
		return err
	})
	if shell != ours {
		t.Errorf("a shell job's restore's CRIU is in process group %d, not gpucr's %d: it could not give the job the terminal", shell, ours)
	}
}

// A restore's tasks are CRIU's forks and can hold copies of CRIU's end of the socket: one
// blocked (opening a FIFO, say) kept the read of CRIU's answer waiting after CRIU was
// killed, through every Ctrl-C and SIGTERM (hostile test). Cancelling ends the wait.
func TestCancelledRestoreEndsWhileCRIUsForksHoldTheSocket(t *testing.T) {
	dir := t.TempDir()
	forked := filepath.Join(dir, "forked")
	script := filepath.Join(dir, "criu")
	body := "#!/bin/sh\nsleep 60 &\necho $! > " + forked + "\nexec sleep 60\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(forked); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := (&Driver{Path: script}).Restore(ctx, RestoreRequest{ImagesDir: dir, WorkDir: dir}, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cancelled restore succeeded")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the cancelled restore still waits for CRIU's answer")
	}
}
