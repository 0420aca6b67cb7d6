package engine

import (
	"context"
	"errors"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/safety"
)

// Analysis is what a checkpoint of a target would refuse, found without touching it.
type Analysis struct {
	Processes    int              `json:"processes"`
	GPUProcesses []gpu.Process    `json:"gpuProcesses"`
	Findings     []safety.Finding `json:"findings"`
}

// Analyze runs the checks a checkpoint runs before it locks anything, and reports every
// finding instead of stopping at the first: nothing is locked, frozen or written. The
// checks are those r's checkpoint would run (skipsFor).
func (e *Engine) Analyze(ctx context.Context, target Target, r CheckpointRequest) (*Analysis, error) {
	tree, err := target.Open(ctx)
	if err != nil {
		return nil, err
	}
	a := &Analysis{Processes: len(tree), GPUProcesses: []gpu.Process{}, Findings: []safety.Finding{}}
	snap := proctree.Snap("/proc", tree)
	found, err := FindGPUProcs(ctx, e.Backends, e.Off, snap)
	var refused *safety.Finding
	switch {
	case errors.As(err, &refused):
		a.Findings = append(a.Findings, *refused) // a backend's own refusal
	case err != nil:
		return nil, err
	}
	switch err := found.refuseUnloadable(target, snap); {
	case errors.As(err, &refused):
		a.Findings = append(a.Findings, *refused)
	case err != nil:
		return nil, err
	}
	for _, snap := range found.Snapshots {
		a.GPUProcesses = append(a.GPUProcesses, snap.Processes...)
	}
	a.Findings = append(a.Findings, safety.Analyze(snap, found.GPUs.safetyView(), skipsFor(target, r))...)
	return a, nil
}
