package engine

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/gputest"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
)

// secondNode is the fake GPU as a second node sees it: its one device has another UUID,
// so the image's device moves to it; it records the PID the driver is asked to restore.
type secondNode struct {
	*fakeGPU
	restored []int
}

func (s *secondNode) PlanRestore(_ context.Context, in gpu.RestoreInput) (*gpu.Plan, error) {
	return gputest.PlanMoved(in, "GPU-b")
}

func (s *secondNode) Restore(ctx context.Context, pid int, remap map[string]string) error {
	s.restored = append(s.restored, pid)
	return s.fakeGPU.Restore(ctx, pid, remap)
}

// A GPU process that is the first of its own PID namespace, checkpointed here and restored
// as on a second node: the image numbers it 1, as its namespace did; the restore takes none
// of this host's PIDs, resumes the GPU at the host PID the process got, on the node's own
// GPU, and says so in its result and its log.
func TestGPUTreeOfItsOwnPIDNamespaceMovesToAnotherNode(t *testing.T) {
	fake := &fakeGPU{}
	e := newEngine(t, fake)
	fake.pid = testutil.StartUnsharedSleeper(t, "--pid", "--uts", "--net")
	dir := filepath.Join(t.TempDir(), "img")
	m, err := e.Checkpoint(context.Background(), e.Tree(fake.pid), CheckpointRequest{Dir: dir, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if m.RootPID != 1 || !m.OwnPIDNamespace() || m.GPUs[0].Processes[0].PID != 1 {
		t.Fatalf("image root %d, GPU process %d: want both numbered 1, as their namespace did", m.RootPID, m.GPUs[0].Processes[0].PID)
	}
	testutil.WaitGone(t, fake.pid)

	node := &secondNode{fakeGPU: fake}
	var log bytes.Buffer
	e.Backends = []gpu.Backend{node}
	e.Log = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	res, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.KillAndReap(res.RootPID) })
	if in, err := proctree.InnerPID(res.RootPID); err != nil || in != 1 || res.RootPID == 1 {
		t.Errorf("restored root: host PID %d, PID %d in its namespace (%v); want a host PID and 1 inside", res.RootPID, in, err)
	}
	if !slices.Equal(node.restored, []int{res.RootPID}) {
		t.Errorf("the driver restored PIDs %v, want the restored root's host PID %d", node.restored, res.RootPID)
	}
	want := map[string]string{"GPU-a": "GPU-b"}
	if !maps.Equal(fake.remap, want) || !maps.Equal(res.GPUMap["fake"], want) {
		t.Errorf("remap given to the driver %v, in the result %v; want %v", fake.remap, res.GPUMap, want)
	}
	if !strings.Contains(log.String(), `msg="GPU moved" backend=fake image=GPU-a host=GPU-b`) {
		t.Errorf("the log does not say which GPU moved:\n%s", log.String())
	}
	if !testutil.Alive(res.RootPID) {
		t.Errorf("the restored root %d did not run on", res.RootPID)
	}
}
