package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/testutil"
)

// withBytes matches a progress line of phase with bytes done out of the 64 MiB and more
// of the counter's memory.
func withBytes(phase string) *regexp.Regexp {
	return regexp.MustCompile(`msg=progress phase=` + phase + ` elapsed=\S+ done="[0-9.]+ [KM]iB" total="[0-9.]+ MiB" percent=\d+ rate=`)
}

// A checkpoint and a restore whose stderr is not a terminal log their memory save and
// fill with bytes while they run (the interval is cut short here), and nothing on stdout,
// which stays one JSON document with the root's host PID; --quiet logs no progress at all.
func TestLongPhasesLogProgressOffATerminal(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "64")
	dir := filepath.Join(t.TempDir(), "img")
	stdout, stderr, code := gpucrEnv(t, nil, "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--json", "--progress-every", "1ms")
	if code != 0 {
		t.Fatalf("checkpoint: exit %d\n%s", code, stderr)
	}
	testutil.WaitGone(t, w.pid)
	var ck checkpointDoc
	if err := json.Unmarshal([]byte(stdout), &ck); err != nil {
		t.Errorf("stdout is not one JSON document: %q (%v)", stdout, err)
	}
	if ck.RootPID != w.pid || ck.ContainerPID != 0 {
		t.Errorf("checkpoint says rootPid %d, containerPid %d; want %d and none", ck.RootPID, ck.ContainerPID, w.pid)
	}
	if !withBytes("memory-save").MatchString(stderr) || !strings.Contains(stderr, `msg="phase done" phase=memory-save`) {
		t.Errorf("no progress of the memory save with its bytes on stderr:\n%s", stderr)
	}

	stdout, stderr, code = gpucrEnv(t, nil, "restore", "-D", dir, "--json", "--progress-every", "1ms")
	var r struct {
		RootPID int `json:"rootPid"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || code != 0 {
		t.Fatalf("restore: exit %d, stdout %q (%v)\n%s", code, stdout, err, stderr)
	}
	t.Cleanup(func() { testutil.KillAndReap(r.RootPID) })
	if r.RootPID != w.pid {
		t.Errorf("restore says rootPid %d, want %d (a tree gets its PIDs back)", r.RootPID, w.pid)
	}
	if !withBytes("memory-fill").MatchString(stderr) {
		t.Errorf("no progress of the memory fill with its bytes on stderr:\n%s", stderr)
	}

	w = startCounter(t, "-mib", "64")
	_, stderr, code = gpucrEnv(t, nil, "checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "img"), "-q", "--progress-every", "1ms")
	if code != 0 || stderr != "" {
		t.Errorf("checkpoint -q: exit %d, stderr %q; want nothing on stderr", code, stderr)
	}
}

// Progress is never worth holding a checkpoint for: with stderr a pipe nobody reads (a
// terminal paused, a parent that never reads), the engine stopped at its next phase with
// the workload frozen; with a reader gone (`2>&1 | head -c1`), gpucr died of SIGPIPE
// mid-checkpoint (hostile test). Both checkpoints now complete.
func TestProgressNeverHoldsACheckpoint(t *testing.T) {
	needCRIU(t)
	for _, reader := range []string{"asleep", "gone"} {
		t.Run(reader, func(t *testing.T) {
			w := startCounter(t, "-mib", "64")
			w.waitCount(t, 2)
			r, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := unix.FcntlInt(pw.Fd(), unix.F_SETPIPE_SZ, 4096); err != nil {
				t.Fatal(err)
			}
			if reader == "gone" {
				r.Close()
			} else {
				defer r.Close()
			}
			dir := filepath.Join(t.TempDir(), "img")
			cmd := exec.Command(bin.gpucr, "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--leave-running", "--progress-every", "1ms")
			cmd.Stderr = pw
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pw.Close()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("checkpoint with its stderr's reader %s: %v", reader, err)
				}
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("checkpoint with its stderr's reader %s: still running after 60 s (killed: %v)", reader, <-done)
			}
			mustGpucr(t, "verify", dir)
			w.waitCount(t, w.read(t, "count")+2)
		})
	}
}
