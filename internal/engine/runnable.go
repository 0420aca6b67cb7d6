package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gpucr/gpucr/internal/freezer"
	"github.com/gpucr/gpucr/internal/proctree"
)

// The CUDA driver locks, checkpoints and resumes a process with the process's own help: a
// GPU process that does not run makes those calls wait for as long as it stays stopped,
// whatever their timeout (a checkpoint through containerd hung so until it was killed).

// refuseStopped fails for a GPU process of gpus that a signal or its tracer has stopped:
// only its owner may let it run again.
func refuseStopped(gpus GPUSet, tree *proctree.Snapshot) error {
	for _, p := range tree.Processes() {
		if !slices.ContainsFunc(gpus, func(g GPUProc) bool { return g.PID == p.PID }) {
			continue
		}
		switch p.State {
		case 'T':
			return fmt.Errorf("GPU process %d (%s) is stopped by a signal, and the GPU driver cannot lock a process that does not run: let it run (kill -CONT %d) and try again", p.PID, p.Command, p.PID)
		case 't':
			return fmt.Errorf("GPU process %d (%s) is stopped by its tracer (a debugger?), and the GPU driver cannot lock a process that does not run: detach the tracer and try again", p.PID, p.Command)
		}
	}
	return nil
}

// warnWhileStopped says, once for each, which GPU process a signal or its tracer stops
// while the driver's lock waits for it, every interval until the returned func is called.
// One stopped after refuseStopped looked holds the lock — one call no timeout or Ctrl-C
// cuts short — for as long as it stays stopped, and gpucr seemed to hang without a word.
func warnWhileStopped(gpus GPUSet, log *slog.Logger, interval time.Duration) (done func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		told := map[int]bool{}
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, g := range gpus {
				p, err := proctree.Read(g.PID)
				if told[g.PID] || err != nil || (p.State != 'T' && p.State != 't') {
					continue
				}
				told[g.PID] = true
				log.Warn("a GPU process is stopped, and the driver's lock waits until it runs: let it run (kill -CONT, or detach its tracer); the lock cannot be cut short",
					"pid", g.PID, "command", p.Command)
			}
		}
	})
	return func() { close(stop); wg.Wait() }
}

// stoppedCheckEvery is how often warnWhileStopped looks.
const stoppedCheckEvery = time.Second

// frozenCgroups returns the cgroups that freeze any process of gpus, each once, with the
// first GPU process it freezes.
func frozenCgroups(gpus GPUSet) ([]*FrozenError, error) {
	var held []*FrozenError
	for _, p := range gpus {
		c, err := freezer.Holding(p.PID)
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone since it was found: there is nothing of it to lock
		}
		if err != nil {
			return nil, fmt.Errorf("GPU process %d: %w", p.PID, err)
		}
		if c != nil && !slices.ContainsFunc(held, func(h *FrozenError) bool { return h.Cgroup.Dir == c.Dir }) {
			held = append(held, &FrozenError{PID: p.PID, Cgroup: c})
		}
	}
	return held, nil
}

// FrozenError is a GPU process frozen with its cgroup (a paused container): gpucr's own
// checkpoint refuses it; the CRIU integration, under an engine that froze the container
// itself, thaws it for the GPU steps.
type FrozenError struct {
	PID    int
	Cgroup *freezer.Cgroup
}

func (e *FrozenError) Error() string {
	return fmt.Sprintf("GPU process %d is frozen with its cgroup %s (a paused container?), and the GPU driver cannot lock a process that does not run: resume it (runc resume, podman unpause, ctr tasks resume) and try again", e.PID, e.Cgroup)
}
