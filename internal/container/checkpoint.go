package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpucr/gpucr/internal/amd/plugin"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/pageserver"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/safety"
	"github.com/gpucr/gpucr/internal/store/chunked"
	"github.com/gpucr/gpucr/internal/txn"
)

// InfoName is the file, beside the manifest and checksummed with the image, that says
// which container an image holds and where its bundle was.
const InfoName = "container.json"

// Info describes the checkpointed container.
type Info struct {
	ID     string `json:"id"`
	Bundle string `json:"bundle"`
}

// ReadInfo reads dir's container description; os.ErrNotExist means dir holds a process
// tree, not a container.
func ReadInfo(dir string) (*Info, error) {
	b, err := os.ReadFile(filepath.Join(dir, InfoName))
	if err != nil {
		return nil, err
	}
	var i Info
	if err := json.Unmarshal(b, &i); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, InfoName), err)
	}
	return &i, nil
}

// ErrNotRunning means the container is not running, so there is nothing to checkpoint.
var ErrNotRunning = errors.New("container is not running")

// Containers checkpoints and restores runc containers with the engine's CRIU and GPU
// backends.
type Containers struct {
	Engine *engine.Engine
	Runc   *Runc
	// Gpucr is the gpucr binary CRIU runs to fill memory during a restore; "" is this one.
	Gpucr string
}

// CheckpointRequest is which container to checkpoint, where, and how.
type CheckpointRequest struct {
	ID           string
	Dir          string
	LeaveRunning bool
	LockTimeout  time.Duration
	// CRIUWritesPages has CRIU dump all memory, as the engine's request of that name does.
	CRIUWritesPages bool
	// Stream, when set, takes the memory to the store as it is dumped, as the engine's
	// request of that name does: Dir only stages CRIU's other files.
	Stream *chunked.Stream
	// Scratch are paths the caller created for this checkpoint alone, as the engine's
	// request of that name.
	Scratch []string
	CRIUFlags
}

// Checkpoint writes an image of container r.ID to r.Dir. The order is the engine's: GPUs
// locked and checkpointed first, then the dump. runc dumps a paused container and leaves
// it paused, so that the container is killed only once the image is committed: any failure
// before that thaws it and rolls its GPUs back, and it keeps running as before.
func (c *Containers) Checkpoint(ctx context.Context, r CheckpointRequest) (*image.Manifest, error) {
	if os.Geteuid() != 0 {
		return nil, engine.ErrNotRoot
	}
	st, err := c.Runc.State(ctx, r.ID)
	if err != nil {
		return nil, err
	}
	if st.Status != "running" {
		return nil, fmt.Errorf("%w: %s is %s", ErrNotRunning, r.ID, st.Status)
	}
	tree, err := proctree.Tree(st.PID)
	if err != nil {
		return nil, err
	}
	if pid := plugin.UsesKFD(proctree.PIDs(tree)); pid != 0 {
		return nil, fmt.Errorf("process %d of container %s uses an AMD GPU (/dev/kfd): containers with AMD GPUs are not supported yet", pid, r.ID)
	}
	gpus, snaps, err := engine.FindGPUProcs(ctx, c.Engine.Backends, proctree.PIDs(tree))
	if err != nil {
		return nil, err
	}
	if err := safety.Check(tree, gpus.PIDs()); err != nil {
		return nil, err
	}
	m, err := c.manifest(tree, gpus, snaps, r)
	if err != nil {
		return nil, err
	}
	op, err := c.Engine.Begin(txn.OpCheckpoint, "container "+r.ID, "container-"+r.ID, engine.PIDLock(st.PID))
	if err != nil {
		return nil, err
	}
	defer op.End()
	stage, err := c.Engine.BeginStaging(op, r.Dir, r.Scratch, tree, gpus)
	if err != nil {
		return nil, err
	}
	defer stage.Abort() // a no-op once committed

	t := c.Engine.NewTimer(op)
	paused := false
	rollback := func(cause error) error {
		ctx := context.WithoutCancel(ctx) // rollback runs even when the caller gave up
		var errs []error
		if paused {
			if err := c.Runc.Resume(ctx, r.ID); err != nil {
				errs = append(errs, fmt.Errorf("container %s is left paused (runc resume %s): %w", r.ID, r.ID, err))
			} else if err := op.Update(func(r *txn.Record) { r.Container.Paused = false }); err != nil {
				errs = append(errs, err)
			}
		}
		if err := gpus.Resume(ctx, nil); err != nil {
			errs = append(errs, fmt.Errorf("rolling back the GPUs failed, the workload may be stuck: %w", err))
		}
		return errors.Join(append([]error{cause}, errs...)...)
	}
	if len(gpus) > 0 {
		defer c.Engine.TuneHost(op)() // as for a process tree: the driver stages into huge pages
		if err := t.Run(engine.PhaseGPULock, func() error { return gpus.Lock(ctx, r.LockTimeout) }); err != nil {
			return nil, rollback(fmt.Errorf("lock GPU processes: %w", err))
		}
		if err := t.Run(engine.PhaseGPUCheckpoint, func() error { return gpus.Checkpoint(ctx) }); err != nil {
			return nil, rollback(fmt.Errorf("checkpoint GPU state: %w", err))
		}
	}
	// Journaled as paused before the pause: resuming a running container is harmless.
	if err := op.Update(func(rec *txn.Record) {
		rec.Container = &txn.Container{ID: r.ID, Runtime: c.Runc.Command(), Paused: true}
	}); err != nil {
		return nil, rollback(err)
	}
	if err := c.Runc.Pause(ctx, r.ID); err != nil {
		return nil, rollback(err)
	}
	paused = true
	if err := ctx.Err(); err != nil {
		return nil, rollback(fmt.Errorf("checkpoint interrupted: %w", err))
	}
	// As for a process tree, gpucr saves the large runs of the processes' memory
	// itself, on all cores, and CRIU leaves them out: the container stays paused after
	// runc's dump, so they are read from frozen processes.
	var saved []memfill.Range
	var env []string
	if !r.CRIUWritesPages {
		if saved, err = selectMemory(tree, m); err != nil {
			return nil, rollback(err)
		}
		if len(saved) > 0 {
			ranges := filepath.Join(stage.LogsDir(), "gpucr-skip-ranges")
			if err := memfill.WriteRanges(ranges, saved); err != nil {
				return nil, rollback(err)
			}
			env = []string{memfill.SkipEnv + "=" + ranges}
		}
	}
	var pages *pageserver.Server
	pageServer := ""
	if r.Stream != nil {
		// CRIU sends the pages through gpucr's page server, which stores them as they come.
		if pages, err = pageserver.Start(stage.CRIUDir(), engine.StoreSink(r.Stream)); err != nil {
			return nil, rollback(err)
		}
		defer pages.Close()
		pageServer = fmt.Sprintf("127.0.0.1:%d", pages.Port())
	}
	err = t.Run(engine.PhaseCRIUDump, func() error {
		err := c.Runc.Checkpoint(ctx, r.ID, stage.CRIUDir(), stage.LogsDir(), r.CRIUFlags, env, pageServer)
		switch {
		case pages == nil:
			return err
		case err != nil && pages.Err() != nil:
			return pages.Err() // the page server failed first; CRIU saw it hang up
		case err != nil:
			return err
		}
		_, err = pages.Wait(ctx)
		return err
	})
	if err != nil {
		return nil, rollback(err)
	}
	info, err := json.MarshalIndent(Info{ID: r.ID, Bundle: st.Bundle}, "", "  ")
	if err != nil {
		return nil, rollback(err)
	}
	if err := os.WriteFile(filepath.Join(stage.Dir(), InfoName), append(info, '\n'), 0o600); err != nil {
		return nil, rollback(fmt.Errorf("write container description: %w", err))
	}
	if err := engine.SaveAndCommit(ctx, t, stage, m, saved, r.Stream); err != nil {
		return nil, rollback(err)
	}
	if err := op.Update(func(r *txn.Record) { r.Committed = true }); err != nil {
		return nil, rollback(err)
	}

	// The image is safe: now the container goes or carries on.
	where := r.Dir
	if r.Stream != nil {
		where = "the store"
	}
	if !r.LeaveRunning {
		if err := c.Runc.Delete(context.WithoutCancel(ctx), r.ID); err != nil {
			return m, fmt.Errorf("image written to %s, but removing container %s failed: %w", where, r.ID, err)
		}
		m.Phases = t.Phases
		return m, nil
	}
	if err := c.Runc.Resume(context.WithoutCancel(ctx), r.ID); err != nil {
		return m, fmt.Errorf("image written to %s, but container %s is left paused: %w", where, r.ID, err)
	}
	if len(gpus) > 0 {
		if err := t.Run(engine.PhaseGPUResume, func() error { return gpus.Resume(context.WithoutCancel(ctx), nil) }); err != nil {
			return m, fmt.Errorf("image written to %s, but resuming the GPU processes failed: %w", where, err)
		}
	}
	m.Phases = t.Phases
	return m, nil
}

// selectMemory picks the memory gpucr saves itself from the container's processes, numbered
// in the image as the container numbers them. m describes tree, process by process.
func selectMemory(tree []proctree.Process, m *image.Manifest) ([]memfill.Range, error) {
	rs, err := memfill.Select(tree)
	if err != nil {
		return nil, err
	}
	inner := map[int]int{}
	for i, p := range tree {
		inner[p.PID] = m.Processes[i].PID
	}
	for i := range rs {
		rs[i].ImagePID = inner[rs[i].PID]
	}
	return rs, nil
}

// manifest describes the container's tree in its own PID namespace, as the image holds it.
func (c *Containers) manifest(tree []proctree.Process, gpus engine.GPUSet, snaps []gpu.Snapshot, r CheckpointRequest) (*image.Manifest, error) {
	inner, err := toInner(gpus)
	if err != nil {
		return nil, err
	}
	m := &image.Manifest{
		GpucrVersion: c.Engine.Version,
		CRIUVersion:  c.Engine.CRIU.VersionString(),
		Created:      time.Now().UTC(),
		Host:         engine.HostInfo(),
		Options: image.Options{
			LeaveRunning: r.LeaveRunning, ShellJob: r.ShellJob, TCPEstablished: r.TCPEstablished,
			ExtUnixSk: r.ExtUnixSk, FileLocks: r.FileLocks,
		},
		GPUs: innerSnapshots(snaps, inner),
	}
	outer := map[int]int{}
	for i, p := range tree {
		in, err := innerPID(p.PID)
		if err != nil {
			return nil, err
		}
		outer[p.PID] = in
		if i == 0 {
			m.RootPID = in
		}
		m.Processes = append(m.Processes, image.Process{PID: in, PPID: outer[p.PPID], Command: p.Command, Threads: p.Threads})
	}
	return m, nil
}

// innerSnapshots returns snaps with each process numbered as in inner, which holds the
// same processes in the same order as the snapshots do.
func innerSnapshots(snaps []gpu.Snapshot, inner engine.GPUSet) []gpu.Snapshot {
	out := slices.Clone(snaps)
	i := 0
	for s := range out {
		out[s].Processes = slices.Clone(out[s].Processes)
		for p := range out[s].Processes {
			out[s].Processes[p].PID = inner[i].PID
			i++
		}
	}
	return out
}
