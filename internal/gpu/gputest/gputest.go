// Package gputest holds what the tests of several packages need of a fake GPU backend.
package gputest

import (
	"context"
	"fmt"
	"slices"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/proctree"
)

// PlanOnto is the restore plan of a fake backend with one device, uuid: an image without
// its snapshot holds none of its state; one whose processes used another device cannot be
// restored here.
func PlanOnto(in gpu.RestoreInput, uuid string) (*gpu.Plan, error) {
	if in.Snapshot == nil {
		return nil, nil
	}
	for _, p := range in.Snapshot.Processes {
		for _, d := range p.Devices {
			if d != uuid {
				return nil, fmt.Errorf("%w: no device %s here", gpu.ErrIncompatible, d)
			}
		}
	}
	return &gpu.Plan{}, nil
}

// PlanMoved is the restore plan of a fake backend with one device, uuid, on another host
// than the image's: every device the image's processes used moves to it, as a real
// backend's planner moves the GPUs of a second node, whose UUIDs all differ.
func PlanMoved(in gpu.RestoreInput, uuid string) (*gpu.Plan, error) {
	if in.Snapshot == nil {
		return nil, nil
	}
	remap := map[string]string{}
	for _, p := range in.Snapshot.Processes {
		for _, d := range p.Devices {
			if d != uuid {
				remap[d] = uuid
			}
		}
	}
	if len(remap) == 0 {
		remap = nil
	}
	return &gpu.Plan{Remap: remap}, nil
}

// Carrier makes a fake backend a gpu.FileCarrier whose CRIU plugin carries the device
// files of Holder, a process without device state (a DataLoader worker, to the NVIDIA
// backend), whenever the tree holds it.
type Carrier struct {
	gpu.Checkpointer
	Holder int
}

// Holders implements gpu.FileCarrier.
func (c *Carrier) Holders(_ context.Context, tree *proctree.Snapshot) ([]int, error) {
	if slices.Contains(tree.PIDs(), c.Holder) {
		return []int{c.Holder}, nil
	}
	return nil, nil
}

// FilePluginDir implements gpu.FileCarrier.
func (c *Carrier) FilePluginDir() string { return "/plugins" }
