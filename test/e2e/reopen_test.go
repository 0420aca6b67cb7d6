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

// CRIU reopens the files a process had open by their paths, as root, following symlinks,
// and checks only their size and mode. A user who owns a directory on such a path (a job's
// working directory in their home) swapped it, between checkpoint and restore, for a symlink
// to /etc, and root's restore handed the process a read-write descriptor on a root-only
// file of the same size and mode (hostile test, 2026-11-26). The restore must be refused
// before the process runs, the other file untouched.
func TestRestoreRefusesAFileReopenedThroughASwappedDirectory(t *testing.T) {
	needCRIU(t)
	base := t.TempDir()
	work, secret := filepath.Join(base, "work"), filepath.Join(base, "secret")
	for _, d := range []string{work, secret} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	content := []byte("root-only secret, 31 bytes long")
	testutil.WriteFile(t, filepath.Join(secret, "data"), content)
	testutil.WriteFile(t, filepath.Join(work, "data"), make([]byte, len(content)))
	for _, f := range []string{filepath.Join(secret, "data"), filepath.Join(work, "data")} {
		if err := os.Chmod(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(filepath.Join(work, "data"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	pid := sleeperHolding(t, f)

	img := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(pid), "-D", img)
	testutil.WaitGone(t, pid)

	// The user's move: the directory becomes a symlink to one holding a file of the same
	// size and mode.
	if err := os.Rename(work, work+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, work); err != nil {
		t.Fatal(err)
	}
	out, code := gpucr(t, "restore", "-D", img)
	if code == 0 {
		link, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/3")
		t.Fatalf("restore succeeded; the restored process's fd 3 is %s\n%s", link, out)
	}
	if !strings.Contains(out, "reopened at another path") {
		t.Errorf("restore failed, but not naming the reopened file:\n%s", out)
	}
	if testutil.Alive(pid) {
		t.Errorf("process %d runs after the refused restore", pid)
	}
	if b, _ := os.ReadFile(filepath.Join(secret, "data")); string(b) != string(content) {
		t.Errorf("the other file changed: %q", b)
	}
}

// sleeperHolding starts a long sleep in a session of its own holding f as its descriptor 3,
// closes f here, and returns the sleep's PID; it is reaped when a checkpoint ends it.
func sleeperHolding(t *testing.T, f *os.File) int {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	cmd.ExtraFiles = []*os.File{f} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err := cmd.Start()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	go cmd.Wait() //nolint:errcheck // reaps it when the checkpoint ends it
	t.Cleanup(func() { testutil.KillAndReap(pid) })
	return pid
}
