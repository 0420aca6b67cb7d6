package criuimg

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// CheckReopened compares what the kernel names each restored descriptor, program and
// mapping by with the paths the image gives them.
func TestCheckReopened(t *testing.T) {
	proc := t.TempDir()
	pidDir := filepath.Join(proc, "4242")
	if err := os.MkdirAll(filepath.Join(pidDir, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := func(name, to string) {
		os.Remove(filepath.Join(pidDir, name))
		if err := os.Symlink(to, filepath.Join(pidDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	link("fd/3", "/home/u/work/data")
	link("exe", "/usr/bin/sleep")
	maps := "55d0c0000000-55d0c0001000 r--p 00000000 08:01 1234                       /usr/bin/sleep\n" +
		"7f0000000000-7f0000001000 r--p 00000000 08:01 99                         /home/u/work/my file\n" +
		"7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n"
	if err := os.WriteFile(filepath.Join(pidDir, "maps"), []byte(maps), 0o644); err != nil {
		t.Fatal(err)
	}
	want := map[int]*Opened{100: {
		FDs:  map[int]string{3: "/home/u/work/data"},
		Maps: map[uint64]string{0x55d0c0000000: "/usr/bin/sleep", 0x7f0000000000: "/home/u/work/my file"},
		Exe:  "/usr/bin/sleep",
	}}
	made := map[int]int{100: 4242}
	if err := CheckReopened(proc, want, made); err != nil {
		t.Fatalf("every file where it was: %v", err)
	}
	link("fd/3", "/etc/shadow") // the directory was swapped for a symlink to /etc
	if err := CheckReopened(proc, want, made); !errors.Is(err, ErrReopenedElsewhere) {
		t.Fatalf("descriptor reopened at /etc/shadow: %v, want ErrReopenedElsewhere", err)
	}
	link("fd/3", "/home/u/work/data")
	maps2 := "7f0000000000-7f0000001000 r--p 00000000 08:01 7                          /etc/shadow\n"
	if err := os.WriteFile(filepath.Join(pidDir, "maps"), []byte(maps2), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckReopened(proc, want, made); !errors.Is(err, ErrReopenedElsewhere) {
		t.Fatalf("mapping reopened at /etc/shadow: %v, want ErrReopenedElsewhere", err)
	}
}
