package proctree

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// A descriptor and its duplicate are one open file; the same path opened again is not.
func TestSameFile(t *testing.T) {
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dup, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dup)
	again, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	pid := os.Getpid()
	if same, err := SameFile(pid, int(f.Fd()), pid, dup); err != nil || !same {
		t.Fatalf("a descriptor and its duplicate: same %v, %v; want one file", same, err)
	}
	if same, err := SameFile(pid, int(f.Fd()), pid, int(again.Fd())); err != nil || same {
		t.Fatalf("a path opened twice: same %v, %v; want two files", same, err)
	}
	if _, err := SameFile(pid, int(f.Fd()), pid, 1<<20); err == nil {
		t.Fatal("a descriptor not open compared without error")
	}
	fds := Snap("/proc", nil).Descriptors(pid, func(p string) bool { return p == "/dev/null" })
	if fds[int(f.Fd())] != "/dev/null" || fds[dup] != "/dev/null" || fds[int(again.Fd())] != "/dev/null" {
		t.Fatalf("Descriptors = %v, want the three of /dev/null", fds)
	}
}
