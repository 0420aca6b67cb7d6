package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// recover --json prints one document, what was recovered and what failed together: a
// hostile test's --pid of a process not stranded printed two, so stdout was no JSON value.
func TestRecoverJSONIsOneDocument(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "recover reads root's journal")
	}
	var stdout, stderr strings.Builder
	code := run([]string{"recover", "--json", "--pid", "999999"}, &stdout, &stderr)
	dec := json.NewDecoder(strings.NewReader(stdout.String()))
	var out recoverOutput
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("stdout is no JSON document: %v\n%s", err, stdout.String())
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one document:\n%s", stdout.String())
	}
	if code == 0 || out.ExitCode != code || !strings.Contains(out.Error, "no such process") {
		t.Fatalf("exit %d, document %+v", code, out)
	}
}

// A streamed checkpoint whose gpucr and guardian both died in the commit may be complete in
// the store: recover says where, and says nothing of the kind for one that died earlier.
func TestRecoverSaysWhereAStreamedCheckpointMayBe(t *testing.T) {
	var out strings.Builder
	stored := txn.Record{Op: txn.OpCheckpoint, Target: "PID 42", Phase: engine.PhaseCommit, Stored: "s3://b/jobs/x"}
	early := stored
	early.Phase, early.Target = engine.PhaseCRIUDump, "PID 43"
	printRecover(&app{stdout: &out}, recoverOutput{Recovered: []txn.Record{stored, early}})
	if got := strings.Count(out.String(), "is complete if `gpucr ls` lists it"); got != 1 || !strings.Contains(out.String(), "the checkpoint at s3://b/jobs/x") {
		t.Fatalf("recover said:\n%s", out.String())
	}
}

// recover --pid of a process a live operation holds (a checkpoint that has it locked or
// checkpointed on its GPU) restored and unlocked it under that operation (review): refused,
// exit 2, naming the holder.
func TestRecoverPIDLeavesAProcessAnOperationHolds(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "recover reads root's journal")
	}
	pid := testutil.StartSleeper(t).Process.Pid
	root := t.TempDir()
	l, err := txn.LockTarget(root, engine.PIDLock(pid), "a checkpoint holds it")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	var stdout, stderr strings.Builder
	code := run([]string{"--run-dir", root, "recover", "--pid", strconv.Itoa(pid)}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stdout.String()+stderr.String(), "a checkpoint holds it") {
		t.Fatalf("exit %d:\n%s%s", code, stdout.String(), stderr.String())
	}
}

// A restore holds its processes by its record, not by their PIDs' locks: recover --pid of
// one it made, checkpointed on its GPU until the restore resumes it, resumed it under the
// restore (review). Refused, exit 2.
func TestRecoverPIDLeavesAProcessARestoreHolds(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "recover reads root's journal")
	}
	pid := testutil.StartSleeper(t).Process.Pid
	root := t.TempDir()
	j, err := txn.Begin(root, txn.OpRestore, "container web")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = j.End() }()
	p, err := txn.ProcOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Update(func(r *txn.Record) { r.GPUs = []txn.GPUProc{{Backend: "nvidia", Proc: p}} }); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	code := run([]string{"--run-dir", root, "recover", "--pid", strconv.Itoa(pid)}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stdout.String()+stderr.String(), "the restore of container web holds it") {
		t.Fatalf("exit %d:\n%s%s", code, stdout.String(), stderr.String())
	}
}

// The image a killed export kept is restored by a command naming its container's ID, with
// --new-id for a container its rolled-back checkpoint left running: the advice was
// `restore --container -D DIR`, no ID, whatever ran (crash test).
func TestRecoverSaysHowToRestoreAKeptExport(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, container.InfoName), []byte(`{"id": "trainer-1", "bundle": "/b"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	kept := txn.Record{Op: txn.OpStaging, Target: "export of container trainer-1", Image: dir, Committed: true}
	printRecover(&app{stdout: &out}, recoverOutput{Recovered: []txn.Record{kept}})
	if want := "gpucr restore --container trainer-1 -D " + dir + ", with --new-id NEWID while container trainer-1 runs"; !strings.Contains(out.String(), want) {
		t.Fatalf("recover said:\n%s\nwant %q", out.String(), want)
	}
}
