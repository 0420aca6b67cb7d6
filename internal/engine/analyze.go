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
	// Carried is what the checkpoint takes by other means than CRIU's own, so that the
	// user knows of it: device files gpucr's CRIU plugin opens again, semaphores whose
	// files the image carries.
	Carried []Carried `json:"carried"`
}

// Carried is a process's files, or a file, a checkpoint carries by gpucr's own means.
type Carried struct {
	PID     int    `json:"pid,omitempty"`
	Command string `json:"command,omitempty"`
	Path    string `json:"path,omitempty"`
	What    string `json:"what"`
}

// Analyze runs the checks a checkpoint runs before it locks anything, and reports every
// finding instead of stopping at the first: nothing is locked, frozen or written. The
// checks are those r's checkpoint would run (skipsFor).
func (e *Engine) Analyze(ctx context.Context, target Target, r CheckpointRequest) (*Analysis, error) {
	tree, err := target.Open(ctx)
	if err != nil {
		return nil, err
	}
	a := &Analysis{Processes: len(tree), GPUProcesses: []gpu.Process{}, Findings: []safety.Finding{}, Carried: []Carried{}}
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
	for _, s := range found.Snapshots {
		a.GPUProcesses = append(a.GPUProcesses, s.Processes...)
		for _, pid := range s.FileHolders {
			a.Carried = append(a.Carried, Carried{PID: pid, Command: snap.Command(pid), What: "its " + s.Backend +
				" device files, its GPU parent's: gpucr's CRIU plugin opens them again on restore, and gives back its mappings of them zero-filled"})
		}
	}
	findings, sems := safety.Analyze(snap, found.GPUs.safetyView(), skipsFor(target, r))
	a.Findings = append(a.Findings, findings...)
	for _, s := range sems {
		a.Carried = append(a.Carried, Carried{Path: s.Path, What: "a POSIX semaphore held under a deleted name: " +
			"its file is carried in the image and made again before each restore"})
	}
	return a, nil
}
