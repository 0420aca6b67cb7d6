// Package nvidia is the NVIDIA GPU backend: NVML describes the devices and finds the
// processes using them; the CUDA driver's checkpoint API moves their device state.
package nvidia

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpucr/gpucr/internal/cuda"
	"github.com/gpucr/gpucr/internal/gpu"
)

func init() { gpu.Register("nvidia", Open) }

// Backend is the NVIDIA implementation of gpu.Backend.
type Backend struct {
	cuda *cuda.Driver
	l2   map[string]uint64 // by UUID, read once: it needs a CUDA context in gpucr itself
	once sync.Once
}

// Open loads NVML and libcuda, or says why NVIDIA GPU support is off on this host.
func Open() (gpu.Backend, error) {
	if r := nvml.Init(); r != nvml.SUCCESS {
		return nil, fmt.Errorf("NVIDIA driver not found (NVML: %s); NVIDIA GPU support is off", nvml.ErrorString(r))
	}
	d, err := cuda.Open("")
	if err != nil {
		nvml.Shutdown()
		return nil, fmt.Errorf("%v; NVIDIA GPU support is off", err)
	}
	return &Backend{cuda: d}, nil
}

// Name implements gpu.Backend.
func (b *Backend) Name() string { return "nvidia" }

// Host implements gpu.Backend.
func (b *Backend) Host(context.Context) (gpu.Host, error) {
	h := gpu.Host{Backend: b.Name()}
	var r nvml.Return
	if h.DriverVersion, r = nvml.SystemGetDriverVersion(); r != nvml.SUCCESS {
		return h, nvmlErr("driver version", r)
	}
	if v, r := nvml.SystemGetCudaDriverVersion(); r == nvml.SUCCESS {
		h.CUDAVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	n, r := nvml.DeviceGetCount()
	if r != nvml.SUCCESS {
		return h, nvmlErr("device count", r)
	}
	b.once.Do(func() { b.l2, _ = b.cuda.L2CacheSizes() })
	for i := 0; i < n; i++ {
		d, err := b.device(i)
		if err != nil {
			return h, err
		}
		h.Devices = append(h.Devices, d)
	}
	return h, nil
}

func (b *Backend) device(i int) (gpu.Device, error) {
	dev, r := nvml.DeviceGetHandleByIndex(i)
	if r != nvml.SUCCESS {
		return gpu.Device{}, nvmlErr(fmt.Sprintf("GPU %d", i), r)
	}
	d := gpu.Device{Index: i, NUMANode: -1, MIGMode: "unsupported", ECCMode: "unsupported"}
	if d.UUID, r = dev.GetUUID(); r != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("GPU %d UUID", i), r)
	}
	if d.Name, r = dev.GetName(); r != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("GPU %d name", i), r)
	}
	major, minor, r := dev.GetCudaComputeCapability()
	if r != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("GPU %d compute capability", i), r)
	}
	d.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	mem, r := dev.GetMemoryInfo()
	if r != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("GPU %d memory", i), r)
	}
	d.MemoryTotal, d.MemoryUsed = mem.Total, mem.Used
	if pci, r := dev.GetPciInfo(); r == nvml.SUCCESS {
		d.PCIBusID = cString(pci.BusId[:])
		d.NUMANode = numaNode(d.PCIBusID)
	}
	if cur, _, r := dev.GetMigMode(); r == nvml.SUCCESS {
		d.MIGMode = map[bool]string{true: "enabled", false: "disabled"}[cur == nvml.DEVICE_MIG_ENABLE]
	}
	if cur, _, r := dev.GetEccMode(); r == nvml.SUCCESS {
		d.ECCMode = map[bool]string{true: "enabled", false: "disabled"}[cur == nvml.FEATURE_ENABLED]
	}
	d.L2CacheBytes = b.l2[d.UUID]
	return d, nil
}

// Processes implements gpu.Backend: a process holds NVIDIA state if NVML lists it as a
// compute process or it has a GPU device file open (a CUDA context always does).
func (b *Backend) Processes(_ context.Context, pids []int) ([]gpu.Process, error) {
	usage := map[int]*gpu.Process{}
	n, r := nvml.DeviceGetCount()
	if r != nvml.SUCCESS {
		return nil, nvmlErr("device count", r)
	}
	for i := 0; i < n; i++ {
		dev, r := nvml.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("GPU %d", i), r)
		}
		uuid, r := dev.GetUUID()
		if r != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("GPU %d UUID", i), r)
		}
		procs, r := dev.GetComputeRunningProcesses()
		if r != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("GPU %d processes", i), r)
		}
		for _, p := range procs {
			u := usage[int(p.Pid)]
			if u == nil {
				u = &gpu.Process{PID: int(p.Pid)}
				usage[int(p.Pid)] = u
			}
			u.Devices = append(u.Devices, uuid)
			u.MemoryBytes += p.UsedGpuMemory
		}
	}
	var out []gpu.Process
	for _, pid := range pids {
		if u, ok := usage[pid]; ok {
			out = append(out, *u)
		} else if opensGPU(pid) {
			out = append(out, gpu.Process{PID: pid})
		}
	}
	return out, nil
}

// opensGPU reports whether pid has an NVIDIA device file open.
func opensGPU(pid int) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		t, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasPrefix(t, "/dev/nvidia") && t != "/dev/nvidia-uvm-tools" {
			return true
		}
	}
	return false
}

// Lock implements gpu.Backend.
func (b *Backend) Lock(_ context.Context, pid int, timeout time.Duration) error {
	return b.cuda.Lock(pid, timeout)
}

// Checkpoint implements gpu.Backend.
func (b *Backend) Checkpoint(_ context.Context, pid int) error { return b.cuda.Checkpoint(pid) }

// Unlock implements gpu.Backend.
func (b *Backend) Unlock(_ context.Context, pid int) error { return b.cuda.Unlock(pid) }

// Restore implements gpu.Backend. The driver takes the remapping as a permutation of this
// host's GPUs, so the moves are completed into one before they are passed on.
func (b *Backend) Restore(ctx context.Context, pid int, remap map[string]string) error {
	var pairs []cuda.GPUPair
	if len(remap) > 0 {
		host, err := b.Host(ctx)
		if err != nil {
			return err
		}
		var uuids []string
		for _, d := range host.Devices {
			uuids = append(uuids, d.UUID)
		}
		for old, new := range Permutation(remap, uuids) {
			o, err := cuda.ParseUUID(old)
			if err != nil {
				return err
			}
			n, err := cuda.ParseUUID(new)
			if err != nil {
				return err
			}
			pairs = append(pairs, cuda.GPUPair{Old: o, New: n})
		}
	}
	return b.cuda.Restore(pid, pairs)
}

// Permutation completes moves (old -> new UUID) into a bijection of this host's GPUs: a
// host GPU that is the target of a move but not itself moved is sent to a host GPU that
// was vacated, so no two devices land on one. GPUs of another host are never targets.
func Permutation(moves map[string]string, host []string) map[string]string {
	out := map[string]string{}
	targets := map[string]bool{}
	for o, n := range moves {
		if o != n {
			out[o] = n
			targets[n] = true
		}
	}
	var vacated []string
	for o := range out {
		if !targets[o] && slices.Contains(host, o) {
			vacated = append(vacated, o)
		}
	}
	slices.Sort(vacated)
	var displaced []string
	for n := range targets {
		if _, moved := out[n]; !moved && slices.Contains(host, n) {
			displaced = append(displaced, n)
		}
	}
	slices.Sort(displaced)
	for i, d := range displaced {
		if i < len(vacated) {
			out[d] = vacated[i]
		}
	}
	return out
}

// State implements gpu.Backend.
func (b *Backend) State(_ context.Context, pid int) (gpu.State, error) {
	st, err := b.cuda.State(pid)
	if err != nil {
		return gpu.StateFailed, err
	}
	switch st {
	case cuda.StateRunning:
		return gpu.StateRunning, nil
	case cuda.StateLocked:
		return gpu.StateLocked, nil
	case cuda.StateCheckpointed:
		return gpu.StateCheckpointed, nil
	}
	return gpu.StateFailed, nil
}

func nvmlErr(what string, r nvml.Return) error {
	return fmt.Errorf("NVML %s: %s", what, nvml.ErrorString(r))
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// numaNode reads the NUMA node of a PCI device from sysfs; -1 when the kernel does not say.
func numaNode(busID string) int {
	id := strings.ToLower(busID)
	if len(id) > 12 { // NVML pads the domain to 8 digits; sysfs uses 4
		id = id[len(id)-12:]
	}
	b, err := os.ReadFile(filepath.Join("/sys/bus/pci/devices", id, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}
