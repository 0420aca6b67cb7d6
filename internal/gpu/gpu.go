// Package gpu defines what the engine needs from a GPU vendor backend, the plain data a
// checkpoint records about devices, and the registry through which backends announce
// themselves. Nothing here names a vendor: each lives in its own package below this one.
package gpu

import (
	"context"
	"fmt"
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
)

// Backend is one vendor's view of a host's GPUs: which processes hold its device state,
// and whether and where an image's state can be restored here. A backend carries that
// state across a checkpoint in one of two ways, and implements the matching interface:
// Checkpointer (the driver moves it into host memory and back around CRIU) or CRIUPlugin
// (CRIU's own plugin saves and restores it within CRIU's dump and restore).
type Backend interface {
	// Name is the short vendor name recorded in images ("nvidia", "amd").
	Name() string
	// Host describes the driver and the devices on this host.
	Host(ctx context.Context) (Host, error)
	// Processes returns the processes of tree that hold device state, with their usage.
	Processes(ctx context.Context, tree *proctree.Snapshot) ([]Process, error)
	// PlanRestore checks, before anything changes, that this host can take an image's
	// device state of this backend, and decides which host device takes each image device.
	// It returns nil when the image holds none of the backend's state.
	PlanRestore(ctx context.Context, in RestoreInput) (*Plan, error)
}

// Checkpointer is a backend whose driver moves a process's device state into the process's
// host memory, so that CRIU dumps it with the rest, and back after CRIU's restore.
type Checkpointer interface {
	Backend
	// Lock stops new device work in pid, waiting at most timeout for work in flight.
	Lock(ctx context.Context, pid int, timeout time.Duration) error
	// Checkpoint moves pid's device state into its host memory and releases the device.
	Checkpoint(ctx context.Context, pid int) error
	// Restore brings device state back from host memory; remap maps image device UUIDs
	// to the UUIDs of the devices to use on this host (nil: the same devices).
	Restore(ctx context.Context, pid int, remap map[string]string) error
	// Unlock lets pid submit device work again.
	Unlock(ctx context.Context, pid int) error
	// State reports where pid stands in the lock/checkpoint cycle.
	State(ctx context.Context, pid int) (State, error)
}

// CRIUPlugin is a backend whose device state a CRIU plugin saves inside CRIU's dump and
// restores inside CRIU's restore: the pipeline only has CRIU load it.
type CRIUPlugin interface {
	Backend
	// PluginDir is the directory CRIU loads the plugin from.
	PluginDir() string
}

// FileCarrier is a backend whose device files, held by processes without device state (a
// child forked after its parent started using the GPU inherits them), a CRIU plugin of
// gpucr's carries through a checkpoint and opens again on restore.
type FileCarrier interface {
	Backend
	// Holders lists the processes of tree holding the backend's device files without
	// device state, where the plugin is installed; where it is not, Processes refuses them.
	Holders(ctx context.Context, tree *proctree.Snapshot) ([]int, error)
	// FilePluginDir is the directory CRIU loads the plugin from.
	FilePluginDir() string
}

// RestoreInput is what a backend plans a restore from.
type RestoreInput struct {
	// Snapshot is the image's record of this backend's devices and processes; nil when
	// the image has none (the backend may still find its state in CRIU's files).
	Snapshot *Snapshot
	CRIUDir  string // the image's CRIU files
	// GPUMap is the user's --gpu-map ("0=1,1=0" or UUIDs); empty: the backend decides.
	GPUMap string
	Skips  Skips
	// Root is the root directory the restored processes see (/proc/PID/root of a restored
	// container's process), whose device nodes say which of the host's GPUs they can reach:
	// a container has only those its engine, device plugin or CDI gave it. Empty: the
	// host's own, every GPU. A backend whose devices CRIU's plugin restores ignores it.
	Root string
}

// Plan is how a backend restores an image's state on this host.
type Plan struct {
	// Remap holds the image devices that move: image device -> host device, as the
	// backend names them. Nil: every device stays where it was.
	Remap map[string]string
	// Env holds settings for CRIU's run (a plugin's switches).
	Env []string
	// PluginDir is where CRIU loads a plugin the image's device files need (a FileCarrier's);
	// "" for none.
	PluginDir string
}

// State is a process's position in the backend's checkpoint cycle.
type State int

// The states mirror the driver's: work can run, work is locked out, state is in host memory.
const (
	StateRunning State = iota
	StateLocked
	StateCheckpointed
	StateFailed
)

func (s State) String() string {
	switch s {
	case StateRunning:
		return "running"
	case StateLocked:
		return "locked"
	case StateCheckpointed:
		return "checkpointed"
	case StateFailed:
		return "failed"
	}
	return "unknown"
}

// Process is one process's device usage.
type Process struct {
	PID         int      `json:"pid"`
	Devices     []string `json:"devices"` // device UUIDs
	MemoryBytes uint64   `json:"memoryBytes"`
	// DeviceMemory is MemoryBytes by device UUID: what a restore must find free on the GPU
	// that takes each. Images before it have only the sum.
	DeviceMemory map[string]uint64 `json:"deviceMemoryBytes,omitempty"`
}

// Snapshot is what an image records about GPUs: the host's devices at checkpoint time and
// the processes whose device state was checkpointed.
type Snapshot struct {
	Host
	Processes []Process `json:"processes"`
	// FileHolders are the processes that held the backend's device files without device
	// state, whose files the backend's CRIU plugin carries (FileCarrier).
	FileHolders []int `json:"deviceFileHolders,omitempty"`
}

// Problem says what makes snaps, the GPU snapshots an image or a container's GPU record
// carries, unusable, or "" if nothing does: each backend is listed once, and in its
// snapshot each GPU, by UUID and by index, and each process. A restore plans a backend
// from its first snapshot and keys GPUs and processes by these names, so crafted
// snapshots that repeated them had (hostile tests): a process of a second snapshot
// restored with its device state left checkpointed, the restore saying it succeeded; two
// driver restores run on one process at once, the second failing only once CRIU had
// restored the tree; a GPU lost from the mapping, or compared with its twin as its host GPU.
func Problem(snaps []Snapshot) string {
	backends := make(map[string]bool, len(snaps))
	for _, s := range snaps {
		if backends[s.Backend] {
			return fmt.Sprintf("GPU backend %q is listed twice", s.Backend)
		}
		backends[s.Backend] = true
		if reason := deviceProblem(s.Devices); reason != "" {
			return reason
		}
		held := make(map[int]bool, len(s.Processes))
		for _, p := range s.Processes {
			if held[p.PID] {
				return fmt.Sprintf("GPU process %d is listed twice", p.PID)
			}
			held[p.PID] = true
		}
		for _, pid := range s.FileHolders {
			if held[pid] {
				return fmt.Sprintf("process %d is listed twice among the GPU processes and those holding device files", pid)
			}
			held[pid] = true
		}
	}
	return ""
}

// deviceProblem says which GPU of devices is named twice, by UUID or by index, if one is.
func deviceProblem(devices []Device) string {
	uuids := make(map[string]bool, len(devices))
	indices := make(map[int]bool, len(devices))
	for _, d := range devices {
		switch {
		case uuids[d.UUID]:
			return fmt.Sprintf("GPU %q is listed twice", d.UUID)
		case indices[d.Index]:
			return fmt.Sprintf("two GPUs have index %d", d.Index)
		}
		uuids[d.UUID], indices[d.Index] = true, true
	}
	return ""
}
