package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

// Helpers on images and the filesystems under them.

// sharedImage checkpoints one counter for the corruption tests to copy and damage.
func sharedImage(t *testing.T) (dir string, w *workload) {
	t.Helper()
	w = startCounter(t, "-mib", "4")
	return checkpointGone(t, w), w
}

// checkpointGone checkpoints w into a new image directory, returned once w has exited (as
// a checkpoint without --leave-running leaves it) and its PID is free for a restore.
func checkpointGone(t *testing.T, w *workload) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir)
	testutil.WaitGone(t, w.pid)
	return dir
}

func copyImage(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	return dst
}

func largestPagesFile(t *testing.T, dir string) string {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(dir, "criu", "pages-*.img"))
	best, size := "", int64(-1)
	for _, m := range matches {
		if fi, err := os.Stat(m); err == nil && fi.Size() > size {
			best, size = m, fi.Size()
		}
	}
	if best == "" {
		t.Fatal("image has no pages file")
	}
	return best
}

// smallTmp mounts a tmpfs of size bytes and returns it: a TMPDIR too small for an image.
func smallTmp(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.Itoa(size)); err != nil {
		t.Fatalf("mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// dirSize adds up the sizes of the files in dir whose names start with prefix.
func dirSize(t *testing.T, dir, prefix string) int64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range entries {
		if info, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), prefix) {
			n += info.Size()
		}
	}
	return n
}
