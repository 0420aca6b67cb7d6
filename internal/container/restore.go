package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
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
	t := &timer{r: c.Engine.Report}
	var m *image.Manifest
	err := t.run(engine.PhaseVerify, func() error {
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
	flags := CRIUFlags{ShellJob: m.Options.ShellJob, TCPEstablished: m.Options.TCPEstablished, ExtUnixSk: m.Options.ExtUnixSk, FileLocks: m.Options.FileLocks}
	err = t.run(engine.PhaseCRIURestore, func() error {
		return c.Runc.Restore(ctx, id, bundle, filepath.Join(r.Dir, image.CRIUDir), work, flags)
	})
	if err != nil {
		return nil, fmt.Errorf("%w (logs in %s)", err, work)
	}
	os.RemoveAll(work)

	// From here on a restored container exists: it must come back whole or go.
	gctx := context.WithoutCancel(ctx)
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
		if err := t.run(engine.PhaseGPURestore, func() error { return gpus.Resume(gctx, remap) }); err != nil {
			return nil, c.remove(gctx, id, fmt.Errorf("%w: %v", engine.ErrGPURestore, err))
		}
	}
	return &RestoreResult{ID: id, RootPID: st.PID, Manifest: m, GPUMap: remap, Phases: t.phases}, nil
}

// remove deletes the half-restored container id after cause.
func (c *Containers) remove(ctx context.Context, id string, cause error) error {
	if err := c.Runc.Delete(ctx, id); err != nil {
		return fmt.Errorf("%w; removing the restored container %s also failed: %v", cause, id, err)
	}
	return fmt.Errorf("%w; the restored container %s was removed, the image is unchanged", cause, id)
}
