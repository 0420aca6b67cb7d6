package criuimg

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/hwbreak"
	"github.com/gpucr/gpucr/internal/testutil"
)

// An image restored where its files are not: MissingFiles names each file with a process
// that used it, by descriptor where it had one (fd 3, a data file) and as a mapping where it
// only mapped it (its program). Present, nothing is missing.
// dumpWhenReady starts cmd in a session of its own (killed at the test's end), waits until
// ready says its process is set up, and dumps it with the real CRIU, leaving it running; it
// returns the process's PID and the image directory. It skips t without root or CRIU.
func dumpWhenReady(t *testing.T, cmd *exec.Cmd, ready func(pid int) bool) (int, string) {
	t.Helper()
	criu := os.Getenv("GPUCR_CRIU")
	if criu == "" {
		criu = "/opt/gpucr/criu/sbin/criu"
	}
	if _, err := os.Stat(criu); err != nil || os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "need root and criu at "+criu)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); !ready(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never got ready", cmd.Path)
		}
	}
	img := t.TempDir()
	if out, err := hwbreak.Command(criu, "dump", "-t", strconv.Itoa(pid), "-D", img, "-o", "dump.log", "--leave-running").CombinedOutput(); err != nil {
		t.Fatalf("criu dump: %v\n%s", err, out)
	}
	return pid, img
}

func TestMissingFilesNameTheirUsers(t *testing.T) {
	src, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prog, data := filepath.Join(dir, "sleep-copy"), filepath.Join(dir, "data")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, prog, b)
	if err := os.Chmod(prog, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, data, []byte("input"))
	f, err := os.Open(data)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(prog, "1000")
	cmd.ExtraFiles = []*os.File{f} // fd 3
	pid, img := dumpWhenReady(t, cmd, func(pid int) bool {
		exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
		return exe == prog
	})
	if missing, err := MissingFiles(img); err != nil || missing != nil {
		t.Fatalf("with every file here: %v, %v", missing, err)
	}
	for _, p := range []string{prog, data} {
		if err := os.Rename(p, p+".away"); err != nil {
			t.Fatal(err)
		}
	}
	missing, err := MissingFiles(img)
	want := []MissingFile{{Path: data, PID: pid, FD: 3}, {Path: prog, PID: pid, FD: -1}}
	if err != nil || !reflect.DeepEqual(missing, want) {
		t.Errorf("MissingFiles = %+v, %v; want %+v", missing, err, want)
	}
}
