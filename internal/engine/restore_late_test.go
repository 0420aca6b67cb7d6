package engine

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/testutil"
)

// answerLost is a restore target whose CRIU passes the gate — the tasks verified, filled,
// journaled whole and let go — and then fails, as the RPC does when CRIU's last answer is
// lost (CRIU killed after it resumed the tasks).
type answerLost struct {
	pid     int
	removed bool
}

func (a *answerLost) Open(context.Context, string, *image.Manifest) error { return nil }
func (a *answerLost) What() string                                        { return "fake" }
func (a *answerLost) Locks() []string                                     { return nil }
func (a *answerLost) Check() error                                        { return nil }
func (a *answerLost) CRIUPlugins() bool                                   { return false }
func (a *answerLost) FilePlugins() bool                                   { return false }
func (a *answerLost) CarriesSemaphores() bool                             { return false }
func (a *answerLost) Remove(_ context.Context, cause error) error         { a.removed = true; return cause }
func (a *answerLost) Restore(_ context.Context, _ *Op, s RestoreSpec) (*Restored, error) {
	if err := s.Created(map[int]int{a.pid: a.pid}); err != nil {
		return nil, err
	}
	if err := s.Verified(); err != nil {
		return nil, err
	}
	if err := s.Whole(); err != nil {
		return nil, err
	}
	return nil, &criu.Error{Op: "restore", Err: errors.New("receive response: EOF")}
}

// A restore whose CRIU failed after the tasks were let go returned the error and left them
// running, their GPUs still checkpointed, with no journal to finish them (review): they
// are removed, as for any restore that cannot finish.
func TestRestoreFailingAfterTheTasksWentRemovesThem(t *testing.T) {
	pid := testutil.StartSleeper(t).Process.Pid
	m := &image.Manifest{
		RootPID:   pid,
		Processes: []image.Process{{PID: pid, PPID: 1, Command: "sleep"}},
		GPUs: []gpu.Snapshot{{Host: gpu.Host{Backend: "fake", DriverVersion: "1.0", Devices: []gpu.Device{{UUID: "GPU-a"}}},
			Processes: []gpu.Process{{PID: pid, Devices: []string{"GPU-a"}}}}},
	}
	dir := imagetest.Commit(t, map[string][]byte{"criu/inventory.img": []byte("x")}, m, nil)
	e := newEngine(t, &fakeGPU{pid: pid, state: gpu.StateCheckpointed})
	target := &answerLost{pid: pid}
	_, err := e.Restore(context.Background(), target, RestoreRequest{Dir: dir})
	if err == nil {
		t.Fatal("restore succeeded")
	}
	if !target.removed {
		t.Fatalf("restore failed (%v) and left the tasks it had let go", err)
	}
}

// A target that makes no semaphore files (a container's runtime) refuses an image listing
// some before anything is made: a crafted container image's would have been made in the
// host's /dev/shm.
func TestRestoreRefusesSemaphoresTheTargetDoesNotMake(t *testing.T) {
	pid := testutil.StartSleeper(t).Process.Pid
	name := "sem.gpucr-test-" + strconv.Itoa(pid)
	m := &image.Manifest{
		RootPID:     pid,
		Processes:   []image.Process{{PID: pid, PPID: 1, Command: "sleep"}},
		LinkedFiles: []image.LinkedFile{{Path: "/dev/shm/" + name, Remap: "link_remap.7", Mode: 0o600, Data: make([]byte, 32)}},
	}
	dir := imagetest.Commit(t, map[string][]byte{"criu/inventory.img": []byte("x")}, m, nil)
	e := newEngine(t, &fakeGPU{})
	_, err := e.Restore(context.Background(), &answerLost{pid: pid}, RestoreRequest{Dir: dir})
	if !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("restore = %v, want the image refused", err)
	}
	if _, serr := os.Lstat("/dev/shm/" + name); serr == nil {
		os.Remove("/dev/shm/" + name)
		t.Fatal("the restore made the semaphore's file")
	}
}
