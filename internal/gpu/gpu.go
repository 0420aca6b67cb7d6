// Package gpu defines what the engine needs from a GPU vendor backend, the plain data a
// checkpoint records about devices, and the registry through which backends announce themselves.
package gpu

import (
	"context"
	"time"
)

// Backend moves one vendor's device state of a process into the process's host memory
// (so CRIU can dump it) and back. Backends know their device; the engine knows the order.
type Backend interface {
	// Name is the short vendor name recorded in images ("nvidia", "amd").
	Name() string
	// Host describes the driver and the devices on this host.
	Host(ctx context.Context) (Host, error)
	// Processes returns those of pids that hold device state, with their usage.
	Processes(ctx context.Context, pids []int) ([]Process, error)
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

// Host is the driver and device inventory of one host, as recorded in an image.
type Host struct {
	Backend       string   `json:"backend"`
	DriverVersion string   `json:"driverVersion"`
	CUDAVersion   string   `json:"cudaVersion,omitempty"`
	Devices       []Device `json:"devices"`
}

// Device is one GPU's identity and the properties that restore compatibility checks compare.
type Device struct {
	Index             int    `json:"index"`
	UUID              string `json:"uuid"`
	Name              string `json:"name"`
	ComputeCapability string `json:"computeCapability"`
	MemoryTotal       uint64 `json:"memoryTotalBytes"`
	MemoryUsed        uint64 `json:"memoryUsedBytes"`
	PCIBusID          string `json:"pciBusId"`
	NUMANode          int    `json:"numaNode"`
	L2CacheBytes      uint64 `json:"l2CacheBytes"`
	MIGMode           string `json:"migMode"`
	ECCMode           string `json:"eccMode"`
}

// Process is one process's device usage.
type Process struct {
	PID         int      `json:"pid"`
	Devices     []string `json:"devices"` // device UUIDs
	MemoryBytes uint64   `json:"memoryBytes"`
}

// Snapshot is what an image records about GPUs: the host's devices at checkpoint time and
// the processes whose device state was checkpointed.
type Snapshot struct {
	Host
	Processes []Process `json:"processes"`
}
