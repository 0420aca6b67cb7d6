package engine

import (
	"os/exec"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/testutil"
)

// A GPU process that exited between being found and being checkpointed (a short-lived
// child holding a device file) leaves the set and the image's snapshot alike; the others
// stay, in order.
func TestDropExitedKeepsSetAndSnapshotAligned(t *testing.T) {
	live := testutil.StartSleeper(t).Process.Pid
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	exited := done.Process.Pid
	f := Found{
		GPUs:      GPUSet{{Process: gpu.Process{PID: exited}}, {Process: gpu.Process{PID: live}}},
		Snapshots: []gpu.Snapshot{{Processes: []gpu.Process{{PID: exited}, {PID: live}}}},
	}
	got := f.DropExited()
	if len(got.GPUs) != 1 || got.GPUs[0].PID != live {
		t.Fatalf("GPUs after DropExited: %+v", got.GPUs)
	}
	if ps := got.Snapshots[0].Processes; len(ps) != 1 || ps[0].PID != live {
		t.Fatalf("snapshot after DropExited: %+v", ps)
	}
	if len(f.GPUs) != 2 || len(f.Snapshots[0].Processes) != 2 {
		t.Fatal("DropExited changed the Found it was called on")
	}
}
