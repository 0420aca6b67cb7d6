package container

import (
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/proctree"
)

// toInner renumbers set from host PIDs to container PIDs; GPUSet.Renumber does the reverse
// with the map proctree.HostPIDs made. Backends work on host PIDs, images keep container PIDs.
func toInner(set engine.GPUSet) (engine.GPUSet, error) {
	out := make(engine.GPUSet, len(set))
	for i, p := range set {
		in, err := proctree.InnerPID(p.PID)
		if err != nil {
			return nil, err
		}
		out[i] = p
		out[i].PID = in
	}
	return out, nil
}
