package nvidia

import (
	"context"
	"errors"
	"fmt"
	"github.com/gpucr/gpucr/internal/safety"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/nvidia/cuda"
	"github.com/gpucr/gpucr/internal/proctree"
)

const (
	uuidA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	uuidB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
	uuidC = "GPU-cccccccc-0000-0000-0000-000000000000"
)

// fakeDriver stands in for libcuda and records what the backend asks of it.
type fakeDriver struct {
	l2         map[string]uint64
	l2Err      error
	initErr    error
	state      int
	stateErr   error
	restoreErr error
	calls      []string
	pairs      []cuda.GPUPair
}

func (f *fakeDriver) Init() error                              { f.calls = append(f.calls, "init"); return f.initErr }
func (f *fakeDriver) L2CacheSizes() (map[string]uint64, error) { return f.l2, f.l2Err }
func (f *fakeDriver) State(int) (int, error)                   { return f.state, f.stateErr }
func (f *fakeDriver) Checkpoint(pid int) error                 { return f.call("checkpoint %d", pid) }
func (f *fakeDriver) Unlock(pid int) error                     { return f.call("unlock %d", pid) }
func (f *fakeDriver) Lock(pid int, timeout time.Duration) error {
	return f.call("lock %d %v", pid, timeout)
}
func (f *fakeDriver) Restore(pid int, pairs []cuda.GPUPair) error {
	f.pairs = pairs
	if err := f.call("restore %d", pid); err != nil {
		return err
	}
	return f.restoreErr
}
func (f *fakeDriver) call(format string, args ...any) error {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
	return nil
}

func busID(s string) [32]int8 {
	var b [32]int8
	for i := range len(s) {
		b[i] = int8(s[i])
	}
	return b
}

// h100 is a mock H100 as NVML describes it, running procs.
func mockH100(uuid, bus string, procs ...nvml.ProcessInfo) *mock.Device {
	return &mock.Device{
		GetUUIDFunc:                  func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetNameFunc:                  func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3", nvml.SUCCESS },
		GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) { return 9, 0, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 80 << 30, Used: 17 << 30, Free: 63 << 30}, nvml.SUCCESS
		},
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{BusId: busID(bus)}, nvml.SUCCESS },
		GetMigModeFunc: func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS },
		GetEccModeFunc: func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
			return nvml.FEATURE_ENABLED, nvml.FEATURE_ENABLED, nvml.SUCCESS
		},
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS },
	}
}

func mockNVML(devs ...*mock.Device) *mock.Interface {
	return &mock.Interface{
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return "580.159.04", nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return 13000, nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], nvml.SUCCESS
		},
	}
}

// snap is a snapshot of pids whose procfs is under root.
func snap(root string, pids ...int) *proctree.Snapshot {
	procs := make([]proctree.Process, len(pids))
	for i, pid := range pids {
		procs[i] = proctree.Process{PID: pid}
	}
	return proctree.Snap(root, procs)
}

// writeFile creates path under dir with its parents.
func writeFile(t *testing.T, dir, path, content string) {
	t.Helper()
	p := filepath.Join(dir, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestHost(t *testing.T) {
	d0, d1 := mockH100(uuidA, "00000000:1A:00.0"), mockH100(uuidB, "00000000:9A:00.0")
	d0.GetMigModeFunc = func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS }
	d1.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	d1.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
		return nvml.FEATURE_DISABLED, nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	b := newBackend(mockNVML(d0, d1), &fakeDriver{l2: map[string]uint64{uuidA: 50 << 20}})
	b.sys = t.TempDir()
	writeFile(t, b.sys, "bus/pci/devices/0000:1a:00.0/numa_node", "1\n")
	got, err := b.Host(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := gpu.Host{Backend: "nvidia", DriverVersion: "580.159.04", Properties: gpu.Properties{"cudaVersion": "13.0"}, Devices: []gpu.Device{
		{Index: 0, UUID: uuidA, Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30, MemoryUsed: 17 << 30,
			PCIBusID: "00000000:1A:00.0", NUMANode: 1, Properties: gpu.Properties{
				"computeCapability": "9.0", "l2CacheBytes": "52428800", "migMode": "enabled", "eccMode": "enabled"}},
		{Index: 1, UUID: uuidB, Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30, MemoryUsed: 17 << 30,
			PCIBusID: "00000000:9A:00.0", NUMANode: -1, Properties: gpu.Properties{
				"computeCapability": "9.0", "migMode": "unsupported", "eccMode": "disabled"}},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Host() =\n%+v\nwant\n%+v", got, want)
	}
}

func TestHostCUDAVersion(t *testing.T) {
	for v, want := range map[int]string{13000: "13.0", 12080: "12.8", 12040: "12.4", 11000: "11.0"} {
		lib := mockNVML()
		lib.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return v, nvml.SUCCESS }
		h, err := newBackend(lib, &fakeDriver{}).Host(context.Background())
		if err != nil || h.Properties["cudaVersion"] != want {
			t.Errorf("CUDA %d: Host() = %q, %v; want %q", v, h.Properties["cudaVersion"], err, want)
		}
	}
}

func TestHostL2Unknown(t *testing.T) {
	b := newBackend(mockNVML(mockH100(uuidA, "00000000:1A:00.0")), &fakeDriver{l2Err: errors.New("cuInit: CUDA_ERROR_NO_DEVICE (100)")})
	h, err := b.Host(context.Background())
	if _, known := h.Devices[0].Properties["l2CacheBytes"]; err != nil || known {
		t.Fatalf("Host() = %+v, %v; want L2 0 (unknown) and no error", h, err)
	}
}

func TestHostNVMLErrors(t *testing.T) {
	cases := []struct {
		name    string
		breakIt func(lib *mock.Interface, d *mock.Device)
		want    string
	}{
		{"driver version", func(lib *mock.Interface, _ *mock.Device) {
			lib.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
		}, "NVML driver version: "},
		{"device count", func(lib *mock.Interface, _ *mock.Device) {
			lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		}, "NVML device count: "},
		{"name", func(_ *mock.Interface, d *mock.Device) {
			d.GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
		}, "NVML GPU 0 name: "},
		{"memory", func(_ *mock.Interface, d *mock.Device) {
			d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_UNKNOWN }
		}, "NVML GPU 0 memory: "},
		{"MIG mode other than not supported", func(_ *mock.Interface, d *mock.Device) {
			d.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_UNKNOWN }
		}, "NVML GPU 0 MIG mode: "},
		{"ECC mode", func(_ *mock.Interface, d *mock.Device) {
			d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) { return 0, 0, nvml.ERROR_UNKNOWN }
		}, "NVML GPU 0 ECC mode: "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := mockH100(uuidA, "00000000:1A:00.0")
			lib := mockNVML(d)
			c.breakIt(lib, d)
			_, err := newBackend(lib, &fakeDriver{}).Host(context.Background())
			if err == nil || !strings.HasPrefix(err.Error(), c.want) || !errors.Is(err, nvml.ERROR_UNKNOWN) {
				t.Fatalf("Host() error = %v, want %q wrapping the NVML return", err, c.want)
			}
		})
	}
}

func TestProcesses(t *testing.T) {
	notAvailable := ^uint64(0)
	lib := mockNVML(
		mockH100(uuidA, "00000000:1A:00.0", nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 1 << 30}, nvml.ProcessInfo{Pid: 11, UsedGpuMemory: notAvailable},
			nvml.ProcessInfo{Pid: 50, UsedGpuMemory: 1 << 30}),
		mockH100(uuidB, "00000000:9A:00.0", nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 2 << 30}, nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 1 << 30}),
	)
	b := newBackend(lib, &fakeDriver{})
	proc := t.TempDir()
	link := func(pid int, fd, target string) {
		dir := filepath.Join(proc, fmt.Sprint(pid), "fd")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, fd)); err != nil {
			t.Fatal(err)
		}
	}
	link(12, "0", "/dev/null")
	link(12, "5", "/dev/nvidiactl")
	link(13, "7", "/dev/nvidia3")
	link(14, "3", "/dev/nvidia-uvm")
	link(14, "4", "/dev/nvidia-caps/nvidia-cap1")
	link(14, "5", "socket:[1234]")
	got, err := b.Processes(context.Background(), snap(proc, 10, 11, 12, 13, 14, 15, 10))
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.Process{
		{PID: 10, Devices: []string{uuidA, uuidB}, MemoryBytes: 4 << 30, DeviceMemory: map[string]uint64{uuidA: 1 << 30, uuidB: 3 << 30}},
		{PID: 11, Devices: []string{uuidA}},
		{PID: 12},
		{PID: 13},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Processes() =\n%+v\nwant\n%+v", got, want)
	}
}

// A process that holds a device file the driver knows nothing of (a child forked after its
// parent started CUDA) is refused, named, with what to do.
func TestProcessesRefusesDeviceFilesWithoutCUDAState(t *testing.T) {
	// Process 20 has a CUDA context (NVML lists it); 21, its forked child, holds its open
	// file of /dev/nvidiactl without one.
	// What the driver answers for a child forked after CUDA started (device run 12).
	notInit := &cuda.Error{Call: "cuCheckpointProcessGetState", Code: 3, Name: "CUDA_ERROR_NOT_INITIALIZED"}
	b := newBackend(mockNVML(mockH100(uuidA, "00000000:1A:00.0", nvml.ProcessInfo{Pid: 20, UsedGpuMemory: 1 << 30})),
		&fakeDriver{stateErr: notInit})
	b.sameFile = func(pid, fd, pid2, fd2 int) (bool, error) { return pid == 21 && fd == 9 && pid2 == 20 && fd2 == 9, nil }
	proc := t.TempDir()
	for _, pid := range []string{"20", "21"} {
		if err := os.MkdirAll(filepath.Join(proc, pid, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/dev/nvidiactl", filepath.Join(proc, pid, "fd", "9")); err != nil {
			t.Fatal(err)
		}
	}
	tree := proctree.Snap(proc, []proctree.Process{{PID: 20, Command: "python3"}, {PID: 21, Command: "pt_data_worker"}})
	_, err := b.Processes(context.Background(), tree)
	if !errors.Is(err, safety.ErrUnsafe) || !strings.Contains(err.Error(), "process 21 (pt_data_worker)") || !strings.Contains(err.Error(), "install-deps") {
		t.Fatalf("Processes() error = %v, want a refusal naming process 21 and the plugin's install", err)
	}
	if holders, err := b.Holders(context.Background(), tree); err != nil || len(holders) != 0 {
		t.Fatalf("Holders() without the plugin = %v, %v; want none", holders, err)
	}

	// With the plugin installed the process is a holder whose files it carries, not refused.
	b.filePlugin = t.TempDir()
	procs, err := b.Processes(context.Background(), tree)
	if err != nil || len(procs) != 1 || procs[0].PID != 20 {
		t.Fatalf("Processes() with the plugin = %v, %v; want GPU process 20 alone and no error", procs, err)
	}
	if holders, err := b.Holders(context.Background(), tree); err != nil || !slices.Equal(holders, []int{21}) {
		t.Fatalf("Holders() with the plugin = %v, %v; want [21]", holders, err)
	}

	// A device file the process opened itself (NVML's, say) is not its parent's: the plugin
	// would give it back bare, so it is refused, plugin or not.
	if err := os.Symlink("/dev/nvidia0", filepath.Join(proc, "21", "fd", "10")); err != nil {
		t.Fatal(err)
	}
	tree = proctree.Snap(proc, tree.Processes())
	if _, err := b.Processes(context.Background(), tree); !errors.Is(err, safety.ErrUnsafe) || !strings.Contains(err.Error(), "/dev/nvidia0, opened by itself") {
		t.Fatalf("Processes() with a device file of its own = %v, want it refused, named", err)
	}
	if _, err := b.Holders(context.Background(), tree); err == nil {
		t.Fatal("Holders() with a device file of its own: no error")
	}
}

// The plugin is found beside the CRIU the install script builds, and only there.
func TestFindFilePlugin(t *testing.T) {
	prefix := t.TempDir()
	criu := filepath.Join(prefix, "sbin", "criu")
	if got := FindFilePlugin(criu); got != "" {
		t.Fatalf("FindFilePlugin without the plugin = %q, want none", got)
	}
	writeFile(t, prefix, "lib/nvidia/"+FilePluginFile, "")
	if got, want := FindFilePlugin(criu), filepath.Join(prefix, "lib", "nvidia"); got != want {
		t.Fatalf("FindFilePlugin = %q, want %q", got, want)
	}
	if got := FindFilePlugin(""); got != "" {
		t.Fatalf("FindFilePlugin of no CRIU = %q, want none", got)
	}
}

func TestProcessesUnreadableFds(t *testing.T) {
	b := newBackend(mockNVML(mockH100(uuidA, "00000000:1A:00.0")), &fakeDriver{})
	proc := t.TempDir()
	writeFile(t, proc, "77/fd", "not a directory")
	if _, err := b.Processes(context.Background(), snap(proc, 77)); err == nil || !strings.Contains(err.Error(), "pid 77") {
		t.Fatalf("Processes() error = %v, want one naming pid 77", err)
	}
}

func TestProcessesNVMLError(t *testing.T) {
	d := mockH100(uuidA, "00000000:1A:00.0")
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
	_, err := newBackend(mockNVML(d), &fakeDriver{}).Processes(context.Background(), snap(t.TempDir(), 1))
	if !errors.Is(err, nvml.ERROR_GPU_IS_LOST) || !strings.Contains(err.Error(), "GPU 0 compute processes") {
		t.Fatalf("Processes() error = %v", err)
	}
}

func TestPermutation(t *testing.T) {
	host := []string{"A", "B", "C"}
	cases := []struct {
		name    string
		moves   map[string]string
		want    [][2]string
		wantErr string
	}{
		{"no moves: every GPU stays", nil, [][2]string{{"A", "A"}, {"B", "B"}, {"C", "C"}}, ""},
		{"a move onto another GPU swaps them", map[string]string{"A": "B"}, [][2]string{{"A", "B"}, {"B", "A"}, {"C", "C"}}, ""},
		{"an explicit swap stays", map[string]string{"A": "B", "B": "A"}, [][2]string{{"A", "B"}, {"B", "A"}, {"C", "C"}}, ""},
		{"a chain closes into a cycle", map[string]string{"A": "B", "B": "C"}, [][2]string{{"A", "B"}, {"B", "C"}, {"C", "A"}}, ""},
		{"a move onto the last GPU", map[string]string{"A": "C"}, [][2]string{{"A", "C"}, {"B", "B"}, {"C", "A"}}, ""},
		{"identity moves", map[string]string{"A": "A"}, [][2]string{{"A", "A"}, {"B", "B"}, {"C", "C"}}, ""},
		{"from another host", map[string]string{"X": "A"}, [][2]string{{"B", "B"}, {"C", "C"}, {"X", "A"}}, ""},
		{"all from another host", map[string]string{"X": "A", "Y": "B", "Z": "C"}, [][2]string{{"X", "A"}, {"Y", "B"}, {"Z", "C"}}, ""},
		{"mixed", map[string]string{"X": "A", "B": "C"}, [][2]string{{"A", "B"}, {"B", "C"}, {"X", "A"}}, ""},
		{"target not here", map[string]string{"A": "Q"}, nil, "GPU Q is not on this host"},
		{"two onto one", map[string]string{"A": "C", "B": "C"}, nil, "GPUs A and B both go to C"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := permutation(c.moves, host)
			if c.wantErr != "" {
				if err == nil || err.Error() != c.wantErr {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("permutation(%v) = %v, %v; want %v", c.moves, got, err, c.want)
			}
		})
	}
}

// TestPermutationIsABijection tries every set of moves among four GPUs that sends no two
// GPUs to one, and checks the result keeps the moves and covers each GPU once each way.
func TestPermutationIsABijection(t *testing.T) {
	host := []string{"A", "B", "C", "D"}
	var try func(i int, moves map[string]string, used map[string]bool)
	try = func(i int, moves map[string]string, used map[string]bool) {
		if i == len(host) {
			pairs, err := permutation(moves, host)
			if err != nil {
				t.Fatalf("permutation(%v): %v", moves, err)
			}
			olds, news := map[string]bool{}, map[string]bool{}
			for _, p := range pairs {
				if olds[p[0]] || news[p[1]] {
					t.Fatalf("permutation(%v) = %v: not one-to-one", moves, pairs)
				}
				olds[p[0]], news[p[1]] = true, true
				if want, moved := moves[p[0]]; moved && want != p[1] {
					t.Fatalf("permutation(%v) = %v: lost move %s->%s", moves, pairs, p[0], want)
				}
			}
			if len(pairs) != len(host) {
				t.Fatalf("permutation(%v) = %v: want a pair for each of %v", moves, pairs, host)
			}
			return
		}
		try(i+1, moves, used) // host[i] not moved explicitly
		for _, dst := range host {
			if !used[dst] {
				moves[host[i]], used[dst] = dst, true
				try(i+1, moves, used)
				delete(moves, host[i])
				delete(used, dst)
			}
		}
	}
	try(0, map[string]string{}, map[string]bool{})
}

func TestRestore(t *testing.T) {
	parse := func(s string) [16]byte {
		u, err := cuda.ParseUUID(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	lib := mockNVML(mockH100(uuidA, "00000000:1A:00.0"), mockH100(uuidB, "00000000:9A:00.0"), mockH100(uuidC, "00000000:AA:00.0"))
	cases := []struct {
		name      string
		remap     map[string]string
		driver    fakeDriver
		wantPairs []cuda.GPUPair
		wantErr   string
	}{
		{name: "same GPUs: no pairs"},
		{name: "one move becomes a swap", remap: map[string]string{uuidA: uuidB},
			wantPairs: []cuda.GPUPair{
				{Old: parse(uuidA), New: parse(uuidB)}, {Old: parse(uuidB), New: parse(uuidA)}, {Old: parse(uuidC), New: parse(uuidC)},
			}},
		{name: "target not on this host", remap: map[string]string{uuidA: "GPU-dddddddd-0000-0000-0000-000000000000"},
			wantErr: "GPU remap: GPU GPU-dddddddd-0000-0000-0000-000000000000 is not on this host"},
		{name: "UUID not in NVML's form", remap: map[string]string{"GPU-x": uuidA}, wantErr: `GPU remap: bad GPU UUID "GPU-x": want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`},
		{name: "driver error", driver: fakeDriver{restoreErr: errors.New("cuCheckpointProcessRestore: CUDA_ERROR_NOT_SUPPORTED (801)")},
			wantErr: "cuCheckpointProcessRestore: CUDA_ERROR_NOT_SUPPORTED (801)"},
		{name: "driver error after cuInit failed", driver: fakeDriver{
			restoreErr: errors.New("cuCheckpointProcessRestore: CUDA_ERROR_NOT_INITIALIZED (3)"), initErr: errors.New("cuInit: CUDA_ERROR_NO_DEVICE (100)")},
			wantErr: "cuCheckpointProcessRestore: CUDA_ERROR_NOT_INITIALIZED (3) (and cuInit in gpucr failed: cuInit: CUDA_ERROR_NO_DEVICE (100))"},
		{name: "cuInit failure alone does not matter", driver: fakeDriver{initErr: errors.New("cuInit: CUDA_ERROR_NO_DEVICE (100)")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := c.driver
			err := newBackend(lib, &d).Restore(context.Background(), 42, c.remap)
			if c.wantErr != "" {
				if err == nil || err.Error() != c.wantErr {
					t.Fatalf("Restore() = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(d.pairs, c.wantPairs) || !reflect.DeepEqual(d.calls, []string{"init", "restore 42"}) {
				t.Fatalf("driver saw calls %v with pairs %v; want init, restore with %v", d.calls, d.pairs, c.wantPairs)
			}
		})
	}
}

func TestLockCheckpointUnlock(t *testing.T) {
	d := &fakeDriver{}
	b := newBackend(mockNVML(), d)
	ctx := context.Background()
	for _, err := range []error{b.Lock(ctx, 7, 1500*time.Millisecond), b.Checkpoint(ctx, 7), b.Unlock(ctx, 7)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"lock 7 1.5s", "checkpoint 7", "unlock 7"}; !reflect.DeepEqual(d.calls, want) {
		t.Fatalf("driver saw %v, want %v", d.calls, want)
	}
}

func TestState(t *testing.T) {
	cases := []struct {
		driver  int
		want    gpu.State
		wantErr string
	}{
		{cuda.StateRunning, gpu.StateRunning, ""},
		{cuda.StateLocked, gpu.StateLocked, ""},
		{cuda.StateCheckpointed, gpu.StateCheckpointed, ""},
		{cuda.StateFailed, gpu.StateFailed, ""},
		{7, gpu.StateFailed, "the CUDA driver reports pid 5 in unknown checkpoint state 7"},
	}
	for _, c := range cases {
		got, err := newBackend(mockNVML(), &fakeDriver{state: c.driver}).State(context.Background(), 5)
		if got != c.want || (err == nil) != (c.wantErr == "") || (err != nil && err.Error() != c.wantErr) {
			t.Errorf("driver state %d: State() = %v, %v; want %v, %q", c.driver, got, err, c.want, c.wantErr)
		}
	}
	driverErr := errors.New("cuCheckpointProcessGetState: CUDA_ERROR_INVALID_VALUE (1)")
	if _, err := newBackend(mockNVML(), &fakeDriver{stateErr: driverErr}).State(context.Background(), 5); !errors.Is(err, driverErr) {
		t.Errorf("State() error = %v, want the driver's", err)
	}
}

func TestSysfsPCIAddress(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:1A:00.0": "0000:1a:00.0",
		"0000:9a:00.0":     "0000:9a:00.0",
		"00010000:01:00.0": "10000:01:00.0",
		"00000001:C1:00.0": "0001:c1:00.0",
		"garbage":          "garbage",
	} {
		if got := sysfsPCIAddress(in); got != want {
			t.Errorf("sysfsPCIAddress(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReadNUMANode(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"zero": "0\n", "one": "1", "none": "-1\n", "junk": "x\n"}
	for name, content := range files {
		writeFile(t, dir, name, content)
	}
	want := map[string]int{"zero": 0, "one": 1, "none": -1, "junk": -1, "missing": -1}
	got := map[string]int{}
	for name := range want {
		got[name] = readNUMANode(filepath.Join(dir, name))
	}
	if !maps.Equal(got, want) {
		t.Fatalf("readNUMANode = %v, want %v", got, want)
	}
}

func TestInitError(t *testing.T) {
	for r, want := range map[nvml.Return]string{
		nvml.ERROR_LIBRARY_NOT_FOUND:       "NVIDIA driver not found (libnvidia-ml.so.1 not loadable)",
		nvml.ERROR_DRIVER_NOT_LOADED:       "NVIDIA kernel driver not loaded",
		nvml.ERROR_NO_PERMISSION:           "no permission to use the NVIDIA driver",
		nvml.ERROR_LIB_RM_VERSION_MISMATCH: "differ in version",
		nvml.ERROR_UNKNOWN:                 "NVML init: ",
	} {
		if got := initError(r).Error(); !strings.Contains(got, want) {
			t.Errorf("initError(%d) = %q, want it to say %q", int32(r), got, want)
		}
	}
}

// TestNoDriverMeansGPUSupportOff runs where there is no NVIDIA driver, as in CI: the
// backend must refuse to open with a reason, and Probe must list it as unavailable.
func TestNoDriverMeansGPUSupportOff(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this host has an NVIDIA driver")
	}
	_, err := Open(gpu.Config{})
	if err == nil || !strings.HasSuffix(err.Error(), "; NVIDIA GPU support is off") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Open() = %v, want one line ending in why NVIDIA GPU support is off", err)
	}
	ready, off := gpu.Probe(gpu.Config{})
	for _, b := range ready {
		if b.Name() == "nvidia" {
			t.Fatalf("Probe() lists nvidia as ready")
		}
	}
	i := slices.IndexFunc(off, func(o gpu.Off) bool { return o.Name == Name })
	if i < 0 || off[i].Reason.Error() != err.Error() || !off[i].Holds("/dev/nvidia0") {
		t.Fatalf("Probe() off = %v, want nvidia: %v, holding /dev/nvidia*", off, err)
	}
}
