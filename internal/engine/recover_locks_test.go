package engine

import (
	"slices"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// A stale record (its gpucr and guardian dead) names a process that a live checkpoint now
// holds, locked and checkpointed on its GPU: another verb's recovery restored and
// unlocked it under that checkpoint (review). It waits for the live operation's end, and
// lets the record go for the next recovery.
func TestRecoveryLeavesATargetALiveOperationHolds(t *testing.T) {
	fake := &fakeGPU{}
	fake.pid = testutil.StartSleeper(t).Process.Pid
	root := t.TempDir()
	e := &Engine{Backends: []gpu.Backend{fake}, Version: "test", JournalRoot: root}

	live, err := e.Begin(txn.OpCheckpoint, "PID", PIDLock(fake.pid))
	if err != nil {
		t.Fatal(err)
	}
	fake.state = gpu.StateCheckpointed

	dead, err := txn.Begin(root, txn.OpCheckpoint, "PID")
	if err != nil {
		t.Fatal(err)
	}
	p, err := txn.ProcOf(fake.pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.Update(func(r *txn.Record) {
		r.Tree = []txn.Proc{p}
		r.GPUs = []txn.GPUProc{{Backend: "fake", Proc: p}}
		r.Locks = []string{PIDLock(fake.pid)}
	}); err != nil {
		t.Fatal(err)
	}
	_ = dead.LockFile().Close() // its gpucr died

	if done, err := e.RecoverStale(); err != nil || len(done) != 0 {
		t.Fatalf("RecoverStale = %v, %v; want nothing recovered while the target is held", done, err)
	}
	if slices.Contains(fake.calls, "restore") || fake.state != gpu.StateCheckpointed {
		t.Fatalf("the live checkpoint's GPU state was touched: calls %v, state %s", fake.calls, fake.state)
	}
	entries, err := txn.List(root)
	if err != nil || !slices.ContainsFunc(entries, func(en txn.Entry) bool { return en.ID == dead.ID() && !en.Held }) {
		t.Fatalf("entries %+v, %v: want the dead record left, stale", entries, err)
	}

	live.End()
	fake.state = gpu.StateRunning
	if done, err := e.RecoverStale(); err != nil || len(done) != 1 {
		t.Fatalf("once the live operation ended: RecoverStale = %v, %v; want the record recovered", done, err)
	}
}
