package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/safety"
)

// GPUProc is one process holding device state, with the backend that moves that state.
type GPUProc struct {
	Backend gpu.Checkpointer
	gpu.Process
}

// GPUSet is every process of a tree whose device state a Checkpointer moves. Its
// operations run on all processes in parallel: device state moves at the speed of the
// slowest process, not the sum. It is exported for the container paths, which drive the
// same steps around runc.
type GPUSet []GPUProc

// Found is what the backends find in a tree.
type Found struct {
	GPUs      GPUSet         // processes whose device state a Checkpointer moves
	Snapshots []gpu.Snapshot // each backend's devices and processes, for the image
	// Plugins are the backends whose CRIU plugin carries device state of some process,
	// with the first such process.
	Plugins []PluginUse
	// Carriers are the backends whose CRIU plugin carries device files of processes
	// without device state, with the first such process.
	Carriers []CarrierUse
	// Frozen are the cgroups that freeze GPU processes (Inspect fills it): the driver
	// cannot lock those until they are thawed.
	Frozen []*FrozenError
	// Semaphores are those the checkpoint carries in its image, CRIU dumping them through
	// links (Inspect fills it, for a target that carries them).
	Semaphores []safety.Semaphore
}

// PluginUse is a backend whose CRIU plugin the dump needs, and a process that needs it.
type PluginUse struct {
	Backend gpu.CRIUPlugin
	PID     int
}

// CarrierUse is a backend whose CRIU plugin carries the device files of a process.
type CarrierUse struct {
	Backend gpu.FileCarrier
	PID     int
}

// PluginDir is the one directory CRIU must load plugins from for found ("" for none).
func (f Found) PluginDir() (string, error) {
	dir := ""
	var dirs []string
	for _, p := range f.Plugins {
		dirs = append(dirs, p.Backend.PluginDir())
	}
	for _, c := range f.Carriers {
		dirs = append(dirs, c.Backend.FilePluginDir())
	}
	for _, d := range dirs {
		switch {
		case dir == "":
			dir = d
		case d != dir:
			return "", fmt.Errorf("the tree needs CRIU plugins from two directories (%s, %s): CRIU loads plugins from one", dir, d)
		}
	}
	return dir, nil
}

// refuseUnloadable refuses found's uses of CRIU plugins where target cannot load them (a
// container's device-state plugins, whose runtime runs CRIU). A process whose device files
// only a plugin carries is a finding, as the backend's own refusal of it is where the
// plugin is not installed: --dry-run reports it too.
func (f Found) refuseUnloadable(target Target, tree *proctree.Snapshot) error {
	if p := f.Plugins; len(p) > 0 && !target.CRIUPlugins() {
		return fmt.Errorf("process %d of %s holds %s GPU state, which CRIU's plugin saves: not supported there yet", p[0].PID, target.What(), p[0].Backend.Name())
	}
	if c := f.Carriers; len(c) > 0 && !target.FilePlugins() {
		return &safety.Finding{
			Check: safety.CheckNoCUDAState, PID: c[0].PID, Command: tree.Command(c[0].PID),
			Reason: fmt.Sprintf("holds %s device files without device state (a child forked after its parent started using the GPU), which gpucr's CRIU plugin carries, and CRIU cannot load it for %s", c[0].Backend.Name(), target.What()),
			Fix:    "checkpoint it with gpucr checkpoint PID or gpucr checkpoint --container, whose CRIU loads the plugin",
		}
	}
	return nil
}

// FindGPUProcs asks every backend which processes of tree hold its device state, and
// snapshots the hosts of the backends that have any. A process holding the device files of
// a vendor whose backend is off here (off) is refused: CRIU could not dump its state.
func FindGPUProcs(ctx context.Context, backends []gpu.Backend, off []gpu.Off, tree *proctree.Snapshot) (Found, error) {
	var f Found
	if err := refuseOffVendors(off, tree); err != nil {
		return f, err
	}
	for _, b := range backends {
		procs, err := b.Processes(ctx, tree)
		if err != nil {
			return Found{}, fmt.Errorf("%s: find GPU processes: %w", b.Name(), err)
		}
		var holders []int
		if c, ok := b.(gpu.FileCarrier); ok {
			if holders, err = c.Holders(ctx, tree); err != nil {
				return Found{}, fmt.Errorf("%s: find processes holding device files: %w", b.Name(), err)
			}
			if len(holders) > 0 {
				f.Carriers = append(f.Carriers, CarrierUse{Backend: c, PID: holders[0]})
			}
		}
		if len(procs) == 0 && len(holders) == 0 {
			continue
		}
		host, err := b.Host(ctx)
		if err != nil {
			return Found{}, fmt.Errorf("%s: describe GPUs: %w", b.Name(), err)
		}
		host.Backend = b.Name()
		f.Snapshots = append(f.Snapshots, gpu.Snapshot{Host: host, Processes: procs, FileHolders: holders})
		switch b := b.(type) {
		case gpu.Checkpointer:
			for _, p := range procs {
				f.GPUs = append(f.GPUs, GPUProc{Backend: b, Process: p})
			}
		case gpu.CRIUPlugin:
			if len(procs) > 0 {
				f.Plugins = append(f.Plugins, PluginUse{Backend: b, PID: procs[0].PID})
			}
		default:
			return Found{}, fmt.Errorf("%s: the backend neither checkpoints device state nor has a CRIU plugin", b.Name())
		}
	}
	return f, nil
}

// refuseOffVendors fails when a process of tree holds a device file of a vendor in off.
func refuseOffVendors(off []gpu.Off, tree *proctree.Snapshot) error {
	if len(off) == 0 {
		return nil
	}
	for _, pid := range tree.PIDs() {
		files, err := tree.Files(pid)
		if err != nil {
			continue // gone, or a kernel thread: it holds nothing
		}
		for _, o := range off {
			for _, file := range files {
				if o.Holds(file) {
					return o.Refusal(pid, file)
				}
			}
		}
	}
	return nil
}

// safetyView is the set as the restorability analysis sees it.
func (s GPUSet) safetyView() []safety.GPUProcess {
	out := make([]safety.GPUProcess, len(s))
	for i, p := range s {
		out[i] = safety.GPUProcess{PID: p.PID, Devices: p.Devices}
	}
	return out
}

// PIDs lists the processes of the set.
func (s GPUSet) PIDs() []int {
	out := make([]int, len(s))
	for i, p := range s {
		out[i] = p.PID
	}
	return out
}

// each runs f on every process at once and joins the errors.
func (s GPUSet) each(f func(GPUProc) error) error {
	errs := make([]error, len(s))
	var wg sync.WaitGroup
	for i, p := range s {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(p); err != nil {
				errs[i] = fmt.Errorf("%s pid %d: %w", p.Backend.Name(), p.PID, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Lock stops new device work in every process, waiting at most timeout for work in flight.
func (s GPUSet) Lock(ctx context.Context, timeout time.Duration) error {
	return s.each(func(p GPUProc) error { return p.Backend.Lock(ctx, p.PID, timeout) })
}

// Checkpoint moves every locked process's device state into its host memory.
func (s GPUSet) Checkpoint(ctx context.Context) error {
	return s.each(func(p GPUProc) error { return p.Backend.Checkpoint(ctx, p.PID) })
}

// Resume brings every process back to running from wherever it got to: device state
// restored if it was checkpointed, then unlocked. It is the rollback of lock+checkpoint and
// the last step of a restore; remap says which devices to use (nil: the same ones).
func (s GPUSet) Resume(ctx context.Context, remap map[string]map[string]string) error {
	return s.each(func(p GPUProc) error {
		st, err := p.Backend.State(ctx, p.PID)
		if err != nil {
			return err
		}
		if st == gpu.StateCheckpointed {
			if err := p.Backend.Restore(ctx, p.PID, remap[p.Backend.Name()]); err != nil {
				return err
			}
			st = gpu.StateLocked
		}
		if st == gpu.StateLocked {
			return p.Backend.Unlock(ctx, p.PID)
		}
		if st == gpu.StateFailed {
			return fmt.Errorf("device state is in the driver's failed state")
		}
		return nil
	})
}

// ResumeRetrying is Resume for a workload that must run on (a checkpoint's rollback, one
// left running): a driver call can fail while a process is briefly between states, so it
// tries again every half second for at most wait. A process left locked or checkpointed
// stays frozen on its GPU for good, so the error that remains says how to bring it back.
func (s GPUSet) ResumeRetrying(ctx context.Context, remap map[string]map[string]string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := s.Resume(ctx, remap)
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			pids := make([]string, len(s))
			for i, p := range s {
				pids[i] = strconv.Itoa(p.PID)
			}
			return fmt.Errorf("%w; the workload stays stopped on its GPU until `gpucr recover --pid %s` brings it back", err, strings.Join(pids, ","))
		}
		time.Sleep(resumeRetryEvery)
	}
}

// resumeRetryEvery is how long ResumeRetrying waits between tries.
const resumeRetryEvery = 500 * time.Millisecond

// Renumber returns s with each process at its host PID: host maps the image's PIDs of the
// processes a restore made to them, and a process it does not map is refused. Backends work
// on host PIDs; images keep their own.
func (s GPUSet) Renumber(host map[int]int) (GPUSet, error) {
	out := make(GPUSet, len(s))
	for i, p := range s {
		h, ok := host[p.PID]
		if !ok {
			return nil, fmt.Errorf("GPU process %d of the image was not restored", p.PID)
		}
		out[i] = p
		out[i].PID = h
	}
	return out, nil
}

// DropExited removes from f the GPU processes that have exited since they were found (a
// short-lived child holding a device file, say): they hold no device state to move, and
// the steps that name processes by their PID would fail on them.
func (f Found) DropExited() Found {
	exited := map[int]bool{}
	for _, p := range f.GPUs {
		if q, err := proctree.Read(p.PID); err != nil || q.Zombie {
			exited[p.PID] = true
		}
	}
	if len(exited) == 0 {
		return f
	}
	out := f
	out.GPUs = slices.DeleteFunc(slices.Clone(f.GPUs), func(p GPUProc) bool { return exited[p.PID] })
	out.Snapshots = slices.Clone(f.Snapshots)
	for i := range out.Snapshots {
		out.Snapshots[i].Processes = slices.DeleteFunc(slices.Clone(out.Snapshots[i].Processes),
			func(p gpu.Process) bool { return exited[p.PID] })
	}
	return out
}
