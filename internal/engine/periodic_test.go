package engine

import (
	"context"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/image"
)

// commitWaitsForUnlock is a reporter that holds the commit phase until the fake GPU has
// been unlocked: a checkpoint that resumed its workload only after committing would hang
// here until the limit.
type commitWaitsForUnlock struct {
	f     *fakeGPU
	limit time.Duration
	late  bool // the commit started before the GPUs were unlocked
}

func (r *commitWaitsForUnlock) Start(phase string) {
	if phase != PhaseCommit {
		return
	}
	deadline := time.Now().Add(r.limit)
	for !r.unlocked() {
		if time.Now().After(deadline) {
			r.late = true
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *commitWaitsForUnlock) Done(string, time.Duration) {}

func (r *commitWaitsForUnlock) unlocked() bool {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return slices.Contains(r.f.calls, "unlock")
}

// A periodic checkpoint (--leave-running) lets the workload run again as soon as its state
// is copied: its GPUs are unlocked while the image is still being made durable and
// committed, and the pause it reports ends there, before the checkpoint does.
func TestLeftRunningWorkloadResumesBeforeTheCommit(t *testing.T) {
	fake := &fakeGPU{}
	e := newEngine(t, fake)
	rep := &commitWaitsForUnlock{f: fake, limit: 5 * time.Second}
	e.Report = rep
	fake.pid = startSleeper(t)
	dir := filepath.Join(t.TempDir(), "img")
	start := time.Now()
	res, err := e.Checkpoint(context.Background(), e.Tree(fake.pid), CheckpointRequest{Dir: dir, LockTimeout: time.Second, LeaveRunning: true})
	total := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if rep.late {
		t.Fatal("the commit started while the GPUs were still locked: the workload waited for the image")
	}
	if err := image.Verify(dir, res.Manifest); err != nil {
		t.Fatalf("image not committed whole: %v", err)
	}
	if err := syscall.Kill(fake.pid, 0); err != nil || fake.state != 0 {
		t.Fatalf("workload alive: %v, GPU state %v; want running", err, fake.state)
	}
	if res.Paused <= 0 || res.Paused >= total {
		t.Fatalf("paused %v of a %v checkpoint; want a pause that ends before the checkpoint", res.Paused, total)
	}
	if !slices.ContainsFunc(res.Phases, func(p image.Phase) bool { return p.Name == PhaseGPUResume }) {
		t.Errorf("phases %v lack %s", res.Phases, PhaseGPUResume)
	}
}
