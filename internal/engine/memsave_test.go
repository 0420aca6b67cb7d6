package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/testutil"
)

// phaseLog records the order in which phases start and end.
type phaseLog struct {
	mu     sync.Mutex
	events []string
}

func (l *phaseLog) Start(phase string) { l.add("start " + phase) }
func (l *phaseLog) Done(phase string, _ time.Duration) {
	l.add("done " + phase)
}

func (l *phaseLog) add(e string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// The memory gpucr saves itself is copied out of the tree as soon as CRIU has seized it,
// beside CRIU's dump, not after it: CRIU's whole dump is off the critical path.
func TestMemorySaveStartsWhenCRIUSeizesTheTree(t *testing.T) {
	fake := &fakeGPU{}
	e := newEngine(t, fake)
	log := &phaseLog{}
	e.Report = log
	fake.pid = testutil.StartHolder(t, 64).Process.Pid
	dir := filepath.Join(t.TempDir(), "img")
	res, err := e.Checkpoint(context.Background(), e.Tree(fake.pid), CheckpointRequest{Dir: dir, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := image.Verify(dir, res.Manifest); err != nil {
		t.Fatalf("image not whole: %v", err)
	}
	saveStart := slices.Index(log.events, "start "+PhaseMemorySave)
	dumpDone := slices.Index(log.events, "done "+PhaseCRIUDump)
	if saveStart < 0 || dumpDone < 0 || saveStart > dumpDone {
		t.Fatalf("phases ran %q: want the memory save started before CRIU's dump is done", log.events)
	}
	if !slices.ContainsFunc(res.Phases, func(p image.Phase) bool { return p.Name == PhaseMemorySave }) {
		t.Errorf("phases %v lack %s", res.Phases, PhaseMemorySave)
	}
}

// A disk that fills up while the memory save and CRIU's dump run side by side (which one
// hits it first varies) fails the checkpoint as any other step does: the save is stopped,
// the workload runs on with its GPUs resumed, and nothing is left.
func TestFailedMemorySaveRollsBack(t *testing.T) {
	fake := &fakeGPU{}
	e := newEngine(t, fake)
	fake.pid = testutil.StartHolder(t, 64).Process.Pid
	small := t.TempDir()
	if err := syscall.Mount("tmpfs", small, "tmpfs", 0, "size=16m"); err != nil {
		testutil.SkipOrFail(t, "mount tmpfs: "+err.Error())
	}
	t.Cleanup(func() { _ = syscall.Unmount(small, syscall.MNT_DETACH) })
	_, err := e.Checkpoint(context.Background(), e.Tree(fake.pid), CheckpointRequest{Dir: filepath.Join(small, "img"), LockTimeout: time.Second})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("checkpoint onto a full disk: %v, want the disk's ENOSPC", err)
	}
	if !testutil.Alive(fake.pid) || fake.state != gpu.StateRunning {
		t.Errorf("workload alive %v, GPU state %v; want running", testutil.Alive(fake.pid), fake.state)
	}
	if entries, _ := os.ReadDir(small); len(entries) != 0 {
		t.Errorf("failed checkpoint left %v", entries)
	}
}

// A dump that failed right after CRIU seized the tree waited for the whole memory save
// (copying or uploading everything, to throw it away) before the rollback resumed the
// GPUs (review): failed stops the save, and a save only stopped is no error of its own.
func TestFailedDumpStopsTheMemorySave(t *testing.T) {
	m := &memorySave{done: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.run = func(ctx context.Context) ([]image.File, error) {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("memory save: %w", ctx.Err())
		case <-time.After(time.Minute):
			return nil, errors.New("the save ran to its end")
		}
	}
	m.start()
	start := time.Now()
	if err := m.failed(); err != nil {
		t.Fatalf("failed() = %v, want nil for a save only stopped", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("failed() took %v: it waited for the save to finish", d)
	}

	full := &memorySave{done: make(chan struct{})}
	full.ctx, full.cancel = context.WithCancel(context.Background())
	full.run = func(context.Context) ([]image.File, error) { return nil, syscall.ENOSPC }
	full.start()
	<-full.done
	if err := full.failed(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("failed() = %v, want the save's own ENOSPC", err)
	}
}
