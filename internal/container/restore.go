package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/txn"
)

// RestoreRequest is which image to restore, as which container, and how.
type RestoreRequest struct {
	Dir string
	// ID names the restored container; "" restores it under the ID it was checkpointed as.
	ID string
	// Bundle is the OCI bundle to restore with; "" uses the one recorded at checkpoint.
	Bundle string
	GPUMap string
	Skips  gpu.Skips
	// CRIURestoresPages leaves the memory in CRIU's files to CRIU, as the engine's request
	// of that name does.
	CRIURestoresPages bool
	// Flags are the user's CRIU flags, added to those the image was dumped with.
	Flags criu.Flags
}

// RestoreResult says what came back.
type RestoreResult struct {
	ID       string                       `json:"id"`
	RootPID  int                          `json:"rootPid"` // host PID of the container's init
	Manifest *image.Manifest              `json:"-"`
	GPUMap   map[string]map[string]string `json:"gpuMap,omitempty"`
	Phases   []image.Phase                `json:"phases"`
}

// Restore verifies the image and checks this host's GPUs before runc touches anything,
// then has runc restore the container and brings its device state back. If that fails the
// restored container is removed: nothing is left half-running.
func (c *Containers) Restore(ctx context.Context, r RestoreRequest) (*RestoreResult, error) {
	if os.Geteuid() != 0 {
		return nil, engine.ErrNotRoot
	}
	t := c.Engine.NewTimer(nil) // journaled from Begin on, once the image names the container
	var m *image.Manifest
	err := t.Run(engine.PhaseVerify, func() error {
		var err error
		m, err = image.Open(r.Dir)
		return err
	})
	if err != nil {
		return nil, err
	}
	info, err := ReadInfo(r.Dir)
	if err != nil {
		return nil, fmt.Errorf("%s does not hold a container (restore it without --container): %w", r.Dir, err)
	}
	id, bundle := r.ID, r.Bundle
	if id == "" {
		id = info.ID
	}
	op, err := c.Engine.Begin(txn.OpRestore, "container "+id, "container-"+id)
	if err != nil {
		return nil, err
	}
	defer op.End()
	if bundle == "" {
		bundle = info.Bundle
	}
	gpus, remap, err := engine.PlanGPUs(ctx, c.Engine.Backends, m.GPUs, r.GPUMap, r.Skips)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("restore interrupted: %w", err)
	}
	work, err := os.MkdirTemp("", "gpucr-restore-*")
	if err != nil {
		return nil, fmt.Errorf("create restore work dir: %w", err)
	}
	if err := op.Update(func(rec *txn.Record) { rec.Paths = append(rec.Paths, work) }); err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	if len(gpus) > 0 {
		defer c.Engine.TuneHost(op)() // CRIU and the fill refill the staged memory, the driver copies it back
	}
	imagesDir, env, err := c.planFill(r, m, work)
	if err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	flags := m.Options.ForRestore(r.Flags)
	err = t.Run(engine.PhaseCRIURestore, func() error {
		return c.Runc.Restore(ctx, id, bundle, imagesDir, work, flags, env)
	})
	if err != nil {
		if why := fillFailure(work); why != "" {
			err = fmt.Errorf("%w: %s", err, why) // runc only says that CRIU's script failed
		}
		return nil, fmt.Errorf("%w (logs in %s)", err, work)
	}
	// From here on a restored container exists: it must come back whole or go.
	gctx := context.WithoutCancel(ctx)
	took, filled := fillTook(work)
	os.RemoveAll(work)
	if env != nil && !filled {
		return nil, c.remove(gctx, id, errors.New("CRIU did not run gpucr's memory fill (its CRIU_CONFIG_FILE was not read), so the container's memory is incomplete"))
	}
	if filled {
		t.Phases = append(t.Phases, image.Phase{Name: engine.PhaseMemoryFill, Duration: took})
	}
	st, err := c.Runc.State(gctx, id)
	if err != nil {
		return nil, c.remove(gctx, id, err)
	}
	if len(gpus) > 0 {
		host, err := hostPIDs(st.PID)
		if err != nil {
			return nil, c.remove(gctx, id, err)
		}
		if gpus, err = toHost(gpus, host); err != nil {
			return nil, c.remove(gctx, id, err)
		}
		if err := t.Run(engine.PhaseGPURestore, func() error { return gpus.Resume(gctx, remap) }); err != nil {
			return nil, c.remove(gctx, id, fmt.Errorf("%w: %v", engine.ErrGPURestore, err))
		}
	}
	return &RestoreResult{ID: id, RootPID: st.PID, Manifest: m, GPUMap: remap, Phases: t.Phases}, nil
}

// planFill divides the image's memory between CRIU and gpucr as a process tree's restore
// does: gpucr writes the ranges it saved and the large runs of the leaf processes, from the
// action script it hands CRIU. It returns the CRIU image directory runc restores from and
// the environment that hands CRIU the script.
func (c *Containers) planFill(r RestoreRequest, m *image.Manifest, work string) (string, []string, error) {
	imagesDir := filepath.Join(r.Dir, image.CRIUDir)
	var split []int
	if !r.CRIURestoresPages {
		split = m.Leaves()
	}
	fill, err := c.Engine.PlanFill(r.Dir, work, split)
	if err != nil {
		return "", nil, err
	}
	if fill.Dir != "" {
		imagesDir = fill.Dir
	}
	if fill.Bytes() == 0 {
		return imagesDir, nil, nil
	}
	self := c.Gpucr
	if self == "" {
		if self, err = os.Executable(); err != nil {
			return "", nil, fmt.Errorf("memory fill: find gpucr's own binary: %w", err)
		}
	}
	env, err := fillHook(work, self, fill)
	return imagesDir, env, err
}

// remove deletes the half-restored container id after cause.
func (c *Containers) remove(ctx context.Context, id string, cause error) error {
	if err := c.Runc.Delete(ctx, id); err != nil {
		return fmt.Errorf("%w; removing the restored container %s also failed: %v", cause, id, err)
	}
	return fmt.Errorf("%w; the restored container %s was removed, the image is unchanged", cause, id)
}
