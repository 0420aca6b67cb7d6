package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// restored parses the root PID out of `gpucr restore --json`.
func restore(t *testing.T, dir string, args ...string) int {
	t.Helper()
	out := mustGpucr(t, append([]string{"restore", "--json", "-D", dir}, args...)...)
	var r struct {
		RootPID int `json:"rootPid"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &r); err != nil {
		t.Fatalf("restore output: %v\n%s", err, out)
	}
	t.Cleanup(func() { killAndReap(r.RootPID) })
	return r.RootPID
}

func TestCheckpointRestoreKeepsMemoryAndCountsOn(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "64")
	before := w.waitCount(t, 5)
	dir := filepath.Join(t.TempDir(), "img")
	out := mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir)
	if !strings.Contains(out, "checkpointed PID "+strconv.Itoa(w.pid)) {
		t.Errorf("summary: %s", out)
	}
	waitGone(t, w.pid)
	frozen := w.read(t, "count")
	if frozen < before {
		t.Fatalf("count went back: %d < %d", frozen, before)
	}
	mustGpucr(t, "verify", dir)

	pid := restore(t, dir)
	if pid != w.pid {
		t.Errorf("restored PID %d, want the original %d", pid, w.pid)
	}
	w.waitCount(t, frozen+5)
	if v := w.verify(t, pid); v != "ok" {
		t.Fatalf("memory pattern after restore: %s", v)
	}
}

func TestTreeWithPipeRestores(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-child")
	w.waitFile(t, "child", 3)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir)
	waitGone(t, w.pid)

	var ins inspectOutput
	if err := json.Unmarshal([]byte(mustGpucr(t, "inspect", "--json", dir)), &ins); err != nil {
		t.Fatal(err)
	}
	ps := ins.CRIU.Processes
	if len(ps) != 2 || ps[0].PID != w.pid || ps[1].PPID != w.pid {
		t.Fatalf("inspect tree = %+v, want the counter and its child", ps)
	}
	if len(ins.Manifest.Processes) != 2 || ins.Manifest.CRIUVersion == "" || ins.Manifest.Host.Hostname == "" {
		t.Errorf("manifest = %+v", ins.Manifest)
	}

	child := w.read(t, "child")
	restore(t, dir)
	// The child only counts what the parent sends through the pipe: both must be back.
	w.waitFile(t, "child", child+5)
}

func TestLeaveRunningThenRestoreAfterKill(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "8")
	w.waitCount(t, 3)
	dir := filepath.Join(t.TempDir(), "img")
	out := mustGpucr(t, "checkpoint", "--leave-running", strconv.Itoa(w.pid), "-D", dir)
	at := w.read(t, "count")
	if !strings.Contains(out, "left running") {
		t.Errorf("summary does not say the tree was left running: %s", out)
	}
	w.waitCount(t, at+100) // still counting, well past the checkpoint
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after leave-running: %s", v)
	}

	// The original holds the PIDs: restore must refuse up front, then work once it is gone.
	if out, code := gpucr(t, "restore", "-D", dir); code == 0 || !strings.Contains(out, "in use") {
		t.Fatalf("restore while the original runs: exit %d: %s", code, out)
	}
	killAndReap(w.pid)
	waitGone(t, w.pid)
	os.Remove(filepath.Join(w.dir, "count"))
	pid := restore(t, dir)
	// The restored counter goes on from the checkpoint, not from where the original died.
	first := w.waitCount(t, 1)
	if first > at+50 {
		t.Errorf("restored counter started at %d, checkpoint was at about %d", first, at)
	}
	if v := w.verify(t, pid); v != "ok" {
		t.Fatalf("memory after restore: %s", v)
	}
}
