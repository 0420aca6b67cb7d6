package proctree

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestReadMounts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(p, []byte(`22 1 0:21 / /proc rw,nosuid - proc proc rw
30 22 0:26 / /sys/fs/cgroup/freezer rw shared:9 - cgroup cgroup rw,freezer
31 1 0:27 /sub /mnt/my\040disk rw master:1 shared:2 - tmpfs none rw,size=4k
not a mount line
`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMounts(p)
	want := []Mount{
		{Root: "/", Dir: "/proc", FSType: "proc", Options: "rw"},
		{Root: "/", Dir: "/sys/fs/cgroup/freezer", FSType: "cgroup", Options: "rw,freezer"},
		{Root: "/sub", Dir: "/mnt/my disk", FSType: "tmpfs", Options: "rw,size=4k"},
	}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ReadMounts = %+v, %v; want %+v", got, err, want)
	}
}

// A procfs mounted anywhere (a chroot's) is found beside /proc.
func TestProcMountsFindsEveryProcfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a procfs")
	}
	dir := t.TempDir()
	if err := syscall.Mount("proc", dir, "proc", 0, ""); err != nil {
		t.Skipf("cannot mount a procfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	// A part of one bound elsewhere (as systemd's ProtectKernelTunables binds /proc/sys) is
	// no procfs whose first component is a PID.
	part := t.TempDir()
	if err := syscall.Mount("/proc/sys", part, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(part, syscall.MNT_DETACH) })
	got, err := ProcMounts()
	if err != nil || !slices.Contains(got, "/proc") || !slices.Contains(got, dir) || slices.Contains(got, part) {
		t.Fatalf("ProcMounts = %v, %v; want /proc and %s among them, not %s", got, err, dir, part)
	}
}
