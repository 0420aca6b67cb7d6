// Package gputest holds what the tests of several packages need of a fake GPU backend.
package gputest

import (
	"fmt"

	"github.com/gpucr/gpucr/internal/gpu"
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
