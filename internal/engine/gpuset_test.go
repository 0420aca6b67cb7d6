package engine

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

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

// flakyGPU is a fakeGPU whose first fails restores fail.
type flakyGPU struct {
	*fakeGPU
	fails int
}

func (f *flakyGPU) Restore(ctx context.Context, pid int, remap map[string]string) error {
	if f.fails > 0 {
		f.fails--
		return errors.New("between states")
	}
	return f.fakeGPU.Restore(ctx, pid, remap)
}

// A workload that must run on (a checkpoint's rollback, one left running) is resumed
// through a driver that fails for a moment; one that keeps failing gets an error that says
// how to bring the workload back, instead of a workload silently frozen on its GPU.
func TestResumeRetrying(t *testing.T) {
	flaky := &flakyGPU{fakeGPU: &fakeGPU{pid: 7, state: gpu.StateCheckpointed}, fails: 2}
	set := GPUSet{{Backend: flaky, Process: gpu.Process{PID: 7}}}
	if err := set.ResumeRetrying(context.Background(), nil, 10*time.Second); err != nil || flaky.state != gpu.StateRunning {
		t.Fatalf("resume through two failures: %v, state %v", err, flaky.state)
	}
	stuck := &flakyGPU{fakeGPU: &fakeGPU{pid: 7, state: gpu.StateCheckpointed}, fails: 1 << 30}
	set = GPUSet{{Backend: stuck, Process: gpu.Process{PID: 7}}}
	err := set.ResumeRetrying(context.Background(), nil, time.Second)
	if err == nil || !strings.Contains(err.Error(), "gpucr recover --pid 7") {
		t.Fatalf("a resume that keeps failing: %v", err)
	}
}
