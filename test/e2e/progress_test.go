package e2e

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

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
