package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gpucr/gpucr/internal/gpu"
)

// gpuProc is one process holding device state, with the backend that owns that state.
type gpuProc struct {
	backend gpu.Backend
	gpu.Process
}

// gpuSet is every process of a tree that holds device state. Its operations run on all
// processes in parallel: device state moves at the speed of the slowest process, not the sum.
type gpuSet []gpuProc

// findGPUProcs asks every backend which of pids hold its device state, and snapshots the
// hosts of the backends that have any.
func (e *Engine) findGPUProcs(ctx context.Context, pids []int) (gpuSet, []gpu.Snapshot, error) {
	var set gpuSet
	var snaps []gpu.Snapshot
	for _, b := range e.Backends {
		procs, err := b.Processes(ctx, pids)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: find GPU processes: %w", b.Name(), err)
		}
		if len(procs) == 0 {
			continue
		}
		host, err := b.Host(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: describe GPUs: %w", b.Name(), err)
		}
		host.Backend = b.Name()
		snaps = append(snaps, gpu.Snapshot{Host: host, Processes: procs})
		for _, p := range procs {
			set = append(set, gpuProc{backend: b, Process: p})
		}
	}
	return set, snaps, nil
}

func (s gpuSet) pids() []int {
	out := make([]int, len(s))
	for i, p := range s {
		out[i] = p.PID
	}
	return out
}

// each runs f on every process at once and joins the errors.
func (s gpuSet) each(f func(gpuProc) error) error {
	errs := make([]error, len(s))
	var wg sync.WaitGroup
	for i, p := range s {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(p); err != nil {
				errs[i] = fmt.Errorf("%s pid %d: %w", p.backend.Name(), p.PID, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (s gpuSet) lock(ctx context.Context, timeout time.Duration) error {
	return s.each(func(p gpuProc) error { return p.backend.Lock(ctx, p.PID, timeout) })
}

func (s gpuSet) checkpoint(ctx context.Context) error {
	return s.each(func(p gpuProc) error { return p.backend.Checkpoint(ctx, p.PID) })
}

// resume brings every process back to running from wherever it got to: device state
// restored if it was checkpointed, then unlocked. It is the rollback of lock+checkpoint and
// the last step of a restore; remap says which devices to use (nil: the same ones).
func (s gpuSet) resume(ctx context.Context, remap map[string]map[string]string) error {
	return s.each(func(p gpuProc) error {
		st, err := p.backend.State(ctx, p.PID)
		if err != nil {
			return err
		}
		if st == gpu.StateCheckpointed {
			if err := p.backend.Restore(ctx, p.PID, remap[p.backend.Name()]); err != nil {
				return err
			}
			st = gpu.StateLocked
		}
		if st == gpu.StateLocked {
			return p.backend.Unlock(ctx, p.PID)
		}
		if st == gpu.StateFailed {
			return fmt.Errorf("device state is in the driver's failed state")
		}
		return nil
	})
}
