package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/gputest"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
)

// fakeGPU stands in for the GPU driver, the one hardware edge these CI tests cannot reach:
// it claims one PID as a GPU process and follows the driver's state machine. The real
// driver path is proven on the device (docs/device-runs.md).
type fakeGPU struct {
	pid   int
	thp   string // the THP switch file, read at lock time
	thpAt string // what it said then
	mu    sync.Mutex
	state gpu.State
	calls []string
	remap map[string]string
}

func (f *fakeGPU) record(c string) { f.mu.Lock(); f.calls = append(f.calls, c); f.mu.Unlock() }

func (f *fakeGPU) Name() string { return "fake" }
func (f *fakeGPU) Host(context.Context) (gpu.Host, error) {
	return gpu.Host{DriverVersion: "1.0", Devices: []gpu.Device{{UUID: "GPU-a", Name: "fake", MemoryTotal: 1 << 30}}}, nil
}

// PlanRestore takes an image whose processes used only the fake's one device.
func (f *fakeGPU) PlanRestore(_ context.Context, in gpu.RestoreInput) (*gpu.Plan, error) {
	return gputest.PlanOnto(in, "GPU-a")
}
func (f *fakeGPU) Processes(_ context.Context, tree *proctree.Snapshot) ([]gpu.Process, error) {
	if slices.Contains(tree.PIDs(), f.pid) {
		return []gpu.Process{{PID: f.pid, Devices: []string{"GPU-a"}, MemoryBytes: 1 << 20}}, nil
	}
	return nil, nil
}
func (f *fakeGPU) step(name string, from, to gpu.State) error {
	f.record(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state != from {
		return errors.New(name + " from state " + f.state.String())
	}
	f.state = to
	return nil
}
func (f *fakeGPU) Lock(_ context.Context, _ int, _ time.Duration) error {
	if f.thp != "" {
		b, _ := os.ReadFile(f.thp)
		f.thpAt = string(b)
	}
	return f.step("lock", gpu.StateRunning, gpu.StateLocked)
}
func (f *fakeGPU) Checkpoint(context.Context, int) error {
	return f.step("checkpoint", gpu.StateLocked, gpu.StateCheckpointed)
}
func (f *fakeGPU) Restore(_ context.Context, _ int, remap map[string]string) error {
	f.remap = remap
	return f.step("restore", gpu.StateCheckpointed, gpu.StateLocked)
}
func (f *fakeGPU) Unlock(context.Context, int) error {
	return f.step("unlock", gpu.StateLocked, gpu.StateRunning)
}
func (f *fakeGPU) State(context.Context, int) (gpu.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state, nil
}

func newEngine(t *testing.T, b gpu.Backend) *Engine {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root")
	}
	d, err := criu.Find(os.Getenv("GPUCR_CRIU"))
	if err != nil {
		testutil.SkipOrFail(t, err.Error())
	}
	return &Engine{CRIU: d, Backends: []gpu.Backend{b}, Version: "test"}
}

func TestFailedDumpRollsBackGPUAndLeavesNothing(t *testing.T) {
	// A real failure mid-dump: the image directory sits on a 64 KiB filesystem (a full disk).
	fake := &fakeGPU{}
	e := newEngine(t, fake)
	fake.pid = testutil.StartSleeper(t).Process.Pid
	small := t.TempDir()
	if err := syscall.Mount("tmpfs", small, "tmpfs", 0, "size=64k"); err != nil {
		testutil.SkipOrFail(t, "mount tmpfs: "+err.Error())
	}
	t.Cleanup(func() { _ = syscall.Unmount(small, syscall.MNT_DETACH) })
	dir := filepath.Join(small, "img")
	fake.thp = filepath.Join(t.TempDir(), "thp")
	if err := os.WriteFile(fake.thp, []byte("always [madvise] never\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.THPSwitch = fake.thp

	_, err := e.Checkpoint(context.Background(), e.Tree(fake.pid), CheckpointRequest{Dir: dir, LockTimeout: time.Second})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("checkpoint onto a full disk: %v, want the disk's error", err)
	}
	want := []string{"lock", "checkpoint", "restore", "unlock"}
	if !slices.Equal(fake.calls, want) || fake.state != gpu.StateRunning {
		t.Errorf("GPU calls %v ending %s, want %v ending running", fake.calls, fake.state, want)
	}
	if err := syscall.Kill(fake.pid, 0); err != nil {
		t.Errorf("workload died: %v", err)
	}
	if entries, _ := os.ReadDir(small); len(entries) != 0 {
		t.Errorf("failed checkpoint left %v", entries)
	}
	if b, _ := os.ReadFile(fake.thp); fake.thpAt != "always" || string(b) != "madvise" {
		t.Errorf("THP was %q while locked and %q after the failure, want always then madvise", fake.thpAt, b)
	}
}

func TestInterruptedCheckpointRollsBack(t *testing.T) {
	fake := &fakeGPU{}
	e := newEngine(t, fake)
	fake.pid = testutil.StartSleeper(t).Process.Pid
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Ctrl-C arrived while the GPUs were being locked
	dir := filepath.Join(t.TempDir(), "img")
	_, err := e.Checkpoint(ctx, e.Tree(fake.pid), CheckpointRequest{Dir: dir, LockTimeout: time.Second})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want cancellation", err)
	}
	if fake.state != gpu.StateRunning || syscall.Kill(fake.pid, 0) != nil {
		t.Errorf("after interrupt: GPU %s, calls %v", fake.state, fake.calls)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("interrupted checkpoint left %s", dir)
	}
}

func TestGPUProcessRoundTrip(t *testing.T) {
	fake := &fakeGPU{}
	e := newEngine(t, fake)
	fake.pid = testutil.StartSleeper(t).Process.Pid
	dir := filepath.Join(t.TempDir(), "img")
	m, err := e.Checkpoint(context.Background(), e.Tree(fake.pid), CheckpointRequest{Dir: dir, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.GPUs) != 1 || m.GPUs[0].Backend != "fake" || len(m.GPUs[0].Processes) != 1 || fake.state != gpu.StateCheckpointed {
		t.Fatalf("manifest GPUs %+v, fake state %s", m.GPUs, fake.state)
	}
	for deadline := time.Now().Add(5 * time.Second); syscall.Kill(fake.pid, 0) == nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // CRIU killed it; the cleanup's Wait reaps it
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(fake.pid, &ws, syscall.WNOHANG, nil)
	}
	fake.calls = nil
	res, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(res.RootPID, syscall.SIGKILL) })
	if res.RootPID != fake.pid || !slices.Equal(fake.calls, []string{"restore", "unlock"}) || fake.remap != nil {
		t.Errorf("restore: pid %d (want %d), GPU calls %v, remap %v", res.RootPID, fake.pid, fake.calls, fake.remap)
	}
}

func TestRestoreFailureExplainsTimeWait(t *testing.T) {
	busy := &criu.Error{Op: "restore", Lines: []string{"Error (criu/sk-inet.c:1049): inet: Can't bind inet socket (id 177): Address already in use"}, Err: errors.New("failed")}
	if err := explainRestoreFailure(busy); !errors.As(err, new(*criu.Error)) || !strings.Contains(err.Error(), "TIME_WAIT") {
		t.Errorf("explained: %v", err)
	}
	other := &criu.Error{Op: "restore", Lines: []string{"Error: something else"}, Err: errors.New("failed")}
	// Identity, not errors.Is: the error must come back as it was, not wrapped.
	if err := explainRestoreFailure(other); err != error(other) { //nolint:errorlint
		t.Errorf("other failures must pass unchanged: %v", err)
	}
}
