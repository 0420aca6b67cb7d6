package beneath

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A removal never empties what is mounted beneath it, a bind mount of the same file system
// included (what a container runtime killed halfway leaves), nor follows a symlink out.
func TestRemoveAllStopsAtMountsAndSymlinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	precious := t.TempDir()
	keep := filepath.Join(precious, "rootfs-file")
	if err := os.WriteFile(keep, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(t.TempDir(), "work")
	mnt := filepath.Join(work, "state", "criu-root")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(precious, filepath.Join(work, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "state", "log"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(precious, mnt, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	// Only for a test that stops early: after the test's own unmount below, this one fails.
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })

	if err := RemoveAll(work); !errors.Is(err, ErrMount) {
		t.Fatalf("RemoveAll over a bind mount = %v, want ErrMount", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("the mounted tree was touched: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(work, "link")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the symlink itself should be removed: %v", err)
	}
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := RemoveAll(work); err != nil {
		t.Fatalf("RemoveAll once unmounted = %v", err)
	}
	if _, err := os.Stat(work); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("work is left: %v", err)
	}
	if err := RemoveAll(work); err != nil {
		t.Fatalf("RemoveAll of a missing path = %v", err)
	}
}

// FS opens only regular files of its directory, waits on no FIFO, and lists the directory
// itself but no subdirectory, which could be a symlink leading out of it (review).
func TestFSReadsOnlyItsOwnRegularFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pstree.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo.img"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	fsys := FS(dir)
	if b, err := fs.ReadFile(fsys, "pstree.img"); err != nil || string(b) != "x" {
		t.Errorf("ReadFile = %q, %v", b, err)
	}
	if _, err := fs.ReadFile(fsys, "fifo.img"); err == nil {
		t.Error("a FIFO was read")
	}
	if _, err := fs.ReadFile(fsys, "out/hostname"); err == nil {
		t.Error("a file was read through a symlink")
	}
	if _, err := fs.ReadDir(fsys, "out"); err == nil {
		t.Error("a symlinked directory was listed")
	}
	if names, err := fs.Glob(fsys, "*.img"); err != nil || len(names) != 2 {
		t.Errorf("Glob = %v, %v", names, err)
	}
}
