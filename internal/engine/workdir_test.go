package engine

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

// A restore's work directory goes with whatever a killed CRIU left mounted in it (its cgroup
// yard: a tmpfs with cgroup hierarchies mounted inside): unmounted, then removed, so that
// neither the directory nor a mount outlives the restore.
func TestWorkDirGoesWithWhatCRIUMountedThere(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root")
	}
	work := t.TempDir()
	yard := filepath.Join(work, ".criu.cgyard.test")
	inner := filepath.Join(yard, "inner")
	if err := os.Mkdir(yard, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("none", yard, "tmpfs", 0, ""); err != nil {
		testutil.SkipOrFail(t, "mount tmpfs: "+err.Error())
	}
	if err := os.Mkdir(inner, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("none", inner, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = detachMounts(work) })
	if err := os.RemoveAll(work); err == nil {
		t.Fatal("os.RemoveAll removed a directory with mounts in it: the test shows nothing")
	}
	if err := removeAll(work); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("work directory still there: %v", err)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), work) {
		t.Errorf("a mount under %s is left", work)
	}
}
