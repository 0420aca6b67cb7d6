// Package nvidia is the NVIDIA GPU backend: NVML describes the devices and finds the
// processes using them; the CUDA driver's checkpoint API moves their device state.
package nvidia

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/nvidia/cuda"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/safety"
)

// Name is the backend's name in images and on the command line.
const Name = "nvidia"

// The settings the backend reads: driver libraries off the loader's path (a driver
// installed elsewhere, or the fake ones of the tests).
const (
	SettingLibCUDA = "GPUCR_LIBCUDA"
	SettingLibNVML = "GPUCR_LIBNVML"
)

// vendor is the backend as registered; its DeviceFiles are every NVIDIA device file.
var vendor = gpu.Vendor{
	Name:        Name,
	DeviceFiles: []string{"/dev/nvidia*", "/dev/nvidia-caps/*"},
	// The plugin's records: an image holding them is refused up front where the backend
	// is off, where CRIU failed midway on the descriptors they stand for ("Unable to
	// restore 0x4") when the image's GPU record did not name their processes.
	ImageFiles: []string{FileRecordPattern},
	Checks:     checks,
	Settings:   []string{SettingLibCUDA, SettingLibNVML},
	Open:       Open,
}

func init() { gpu.Register(vendor) }

// driver is what the backend needs of libcuda: *cuda.Driver, or a fake in tests.
type driver interface {
	Init() error
	L2CacheSizes() (map[string]uint64, error)
	State(pid int) (int, error)
	Lock(pid int, timeout time.Duration) error
	Checkpoint(pid int) error
	Restore(pid int, pairs []cuda.GPUPair) error
	Unlock(pid int) error
}

// Backend is the NVIDIA implementation of gpu.Checkpointer and gpu.FileCarrier.
type Backend struct {
	nvml nvml.Interface
	cuda driver
	sys  string // sysfs mount, where PCI devices' NUMA nodes show
	// filePlugin is the directory of gpucr's CRIU plugin for the device files of processes
	// without CUDA state ("" where it is not installed).
	filePlugin string
	// sameFile compares two processes' descriptors (proctree.SameFile; a fake in tests).
	sameFile func(pid, fd, pid2, fd2 int) (bool, error)

	l2Once sync.Once
	l2     map[string]uint64 // by UUID; read once, since it initializes CUDA in gpucr
}

// Open loads NVML and libcuda, from cfg's paths where set, or says in one line why NVIDIA
// GPU support is off here.
func Open(cfg gpu.Config) (gpu.Backend, error) {
	var opts []nvml.LibraryOption
	if p := cfg.Settings[SettingLibNVML]; p != "" {
		opts = append(opts, nvml.WithLibraryPath(p))
	}
	lib := nvml.New(opts...)
	if r := lib.Init(); r != nvml.SUCCESS {
		return nil, fmt.Errorf("%w; NVIDIA GPU support is off", initError(r))
	}
	d, err := cuda.Open(cfg.Settings[SettingLibCUDA])
	if err != nil {
		_ = lib.Shutdown() // NVML is of no use without libcuda; its own error adds nothing
		return nil, fmt.Errorf("%w; NVIDIA GPU support is off", err)
	}
	b := newBackend(lib, d)
	b.filePlugin = FindFilePlugin(cfg.CRIU)
	return b, nil
}

// FileRecordPattern matches the records gpucr's CRIU plugin adds to CRIU's images, one for
// each NVIDIA descriptor it carries (RECORD in criuplugin/gpucr_nvidia.c).
const FileRecordPattern = "gpucr-nvidia-file-*"

// FilePluginFile is gpucr's CRIU plugin for NVIDIA device files held without CUDA state
// (internal/gpu/nvidia/criuplugin), as the install script names it.
const FilePluginFile = "gpucr_nvidia.so"

// FindFilePlugin returns the directory holding FilePluginFile for the CRIU at criuPath,
// PREFIX/lib/nvidia beside PREFIX/sbin/criu as the install script puts it, or "". It is
// kept out of CRIU's default directory, so CRIU loads it only for trees that need it.
func FindFilePlugin(criuPath string) string { return gpu.PluginDir(criuPath, FilePluginFile, "nvidia") }

// FilePluginDir implements gpu.FileCarrier.
func (b *Backend) FilePluginDir() string { return b.filePlugin }

func newBackend(lib nvml.Interface, d driver) *Backend {
	return &Backend{nvml: lib, cuda: d, sys: "/sys", sameFile: proctree.SameFile}
}

// initError words NVML's refusal to start so a user can tell a host without a driver from
// a broken or inaccessible one.
func initError(r nvml.Return) error {
	switch r {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return errors.New("NVIDIA driver not found (libnvidia-ml.so.1 not loadable)")
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("NVIDIA kernel driver not loaded (NVML: %w)", r)
	case nvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("no permission to use the NVIDIA driver (NVML: %w)", r)
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return fmt.Errorf("NVIDIA driver libraries and kernel module differ in version; reload the module or reboot (NVML: %w)", r)
	}
	return fmt.Errorf("NVML init: %w", r)
}

// nvmlError wraps a failed NVML call with what was asked.
func nvmlError(what string, r nvml.Return) error {
	return fmt.Errorf("NVML %s: %w", what, r)
}

// Name implements gpu.Backend.
func (b *Backend) Name() string { return Name }

// Host implements gpu.Backend.
func (b *Backend) Host(context.Context) (gpu.Host, error) {
	h := gpu.Host{Backend: b.Name()}
	var r nvml.Return
	if h.DriverVersion, r = b.nvml.SystemGetDriverVersion(); r != nvml.SUCCESS {
		return gpu.Host{}, nvmlError("driver version", r)
	}
	v, r := b.nvml.SystemGetCudaDriverVersion()
	if r != nvml.SUCCESS {
		return gpu.Host{}, nvmlError("CUDA driver version", r)
	}
	h.Properties = gpu.Properties{propCUDA: fmt.Sprintf("%d.%d", v/1000, v%1000/10)}
	n, r := b.nvml.DeviceGetCount()
	if r != nvml.SUCCESS {
		return gpu.Host{}, nvmlError("device count", r)
	}
	for i := range n {
		d, err := b.device(i)
		if err != nil {
			return gpu.Host{}, err
		}
		h.Devices = append(h.Devices, d)
	}
	return h, nil
}

func (b *Backend) device(i int) (gpu.Device, error) {
	what := func(s string) string { return fmt.Sprintf("GPU %d %s", i, s) }
	dev, r := b.nvml.DeviceGetHandleByIndex(i)
	if r != nvml.SUCCESS {
		return gpu.Device{}, nvmlError(what("handle"), r)
	}
	d := gpu.Device{Index: i, Properties: gpu.Properties{}}
	if d.UUID, r = dev.GetUUID(); r != nvml.SUCCESS {
		return gpu.Device{}, nvmlError(what("UUID"), r)
	}
	if d.Name, r = dev.GetName(); r != nvml.SUCCESS {
		return gpu.Device{}, nvmlError(what("name"), r)
	}
	major, minor, r := dev.GetCudaComputeCapability()
	if r != nvml.SUCCESS {
		return gpu.Device{}, nvmlError(what("compute capability"), r)
	}
	d.Properties[propCompute] = fmt.Sprintf("%d.%d", major, minor)
	mem, r := dev.GetMemoryInfo()
	if r != nvml.SUCCESS {
		return gpu.Device{}, nvmlError(what("memory"), r)
	}
	d.MemoryTotal, d.MemoryUsed = mem.Total, mem.Used
	pci, r := dev.GetPciInfo()
	if r != nvml.SUCCESS {
		return gpu.Device{}, nvmlError(what("PCI info"), r)
	}
	d.PCIBusID = cString(pci.BusId[:])
	d.NUMANode = readNUMANode(filepath.Join(b.sys, "bus/pci/devices", sysfsPCIAddress(d.PCIBusID), "numa_node"))
	mig, _, r := dev.GetMigMode()
	if d.Properties[propMIG], r = mode(r, mig == nvml.DEVICE_MIG_ENABLE); r != nvml.SUCCESS {
		return gpu.Device{}, nvmlError(what("MIG mode"), r)
	}
	ecc, _, r := dev.GetEccMode()
	if d.Properties[propECC], r = mode(r, ecc == nvml.FEATURE_ENABLED); r != nvml.SUCCESS {
		return gpu.Device{}, nvmlError(what("ECC mode"), r)
	}
	if l2 := b.l2Sizes()[d.UUID]; l2 != 0 { // 0: unknown, not recorded
		d.Properties[propL2] = strconv.FormatUint(l2, 10)
	}
	return d, nil
}

// mode words a feature's current mode, treating NVML's "not supported" as an answer.
func mode(r nvml.Return, enabled bool) (string, nvml.Return) {
	switch {
	case r == nvml.ERROR_NOT_SUPPORTED:
		return "unsupported", nvml.SUCCESS
	case r != nvml.SUCCESS:
		return "", r
	case enabled:
		return "enabled", r
	}
	return "disabled", r
}

// l2Sizes reads the L2 cache sizes once through CUDA, as NVML does not report them. If
// CUDA cannot say, they stay 0 ("unknown"), which the compatibility checks allow.
func (b *Backend) l2Sizes() map[string]uint64 {
	b.l2Once.Do(func() {
		if sizes, err := b.cuda.L2CacheSizes(); err == nil {
			b.l2 = sizes
		}
	})
	return b.l2
}

// cString reads NVML's NUL-terminated char array.
func cString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// sysfsPCIAddress turns NVML's "00000000:1A:00.0" into sysfs's "0000:1a:00.0": lower
// case, with the domain at its usual four digits rather than NVML's eight.
func sysfsPCIAddress(busID string) string {
	domain, rest, ok := strings.Cut(strings.ToLower(busID), ":")
	if !ok {
		return strings.ToLower(busID)
	}
	domain = strings.TrimLeft(domain, "0")
	if len(domain) < 4 {
		domain = strings.Repeat("0", 4-len(domain)) + domain
	}
	return domain + ":" + rest
}

// readNUMANode reads a sysfs numa_node file; -1, the kernel's own "no node", when unknown.
func readNUMANode(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

// Processes implements gpu.Backend. A process holds NVIDIA state if NVML lists it as a
// compute process or it has a GPU device file open, which a CUDA context always does
// (NVML cannot see every process, e.g. across some PID namespaces). One holding the files
// without CUDA state is refused unless gpucr's CRIU plugin is here to carry them (Holders).
func (b *Backend) Processes(_ context.Context, tree *proctree.Snapshot) ([]gpu.Process, error) {
	procs, holders, err := b.find(tree)
	if err != nil {
		return nil, err
	}
	for _, h := range holders {
		if h.own != nil {
			return nil, h.own
		}
	}
	if len(holders) > 0 && b.filePlugin == "" {
		return nil, holders[0].refusal
	}
	return procs, nil
}

// Holders implements gpu.FileCarrier: the processes of tree holding NVIDIA device files
// without CUDA state, which the CRIU plugin carries; none where it is not installed.
func (b *Backend) Holders(_ context.Context, tree *proctree.Snapshot) ([]int, error) {
	if b.filePlugin == "" {
		return nil, nil
	}
	_, holders, err := b.find(tree)
	if err != nil {
		return nil, err
	}
	pids := make([]int, len(holders))
	for i, h := range holders {
		if h.own != nil {
			return nil, h.own
		}
		pids[i] = h.pid
	}
	return pids, nil
}

// holder is a process holding NVIDIA device files without CUDA state, and the refusal of
// it where gpucr's CRIU plugin is not installed.
type holder struct {
	pid     int
	refusal error
	// own refuses it whether the plugin is here or not: some of its files are not its GPU
	// parent's but its own, which it may use, and reopened bare they would fail it after a
	// restore.
	own error
}

// find sorts the processes of tree that NVML lists or that hold NVIDIA device files into
// those with CUDA state and those without.
func (b *Backend) find(tree *proctree.Snapshot) ([]gpu.Process, []holder, error) {
	pids := tree.PIDs()
	wanted := map[int]bool{}
	for _, pid := range pids {
		wanted[pid] = true
	}
	found := map[int]*gpu.Process{}
	n, r := b.nvml.DeviceGetCount()
	if r != nvml.SUCCESS {
		return nil, nil, nvmlError("device count", r)
	}
	for i := range n {
		dev, r := b.nvml.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			return nil, nil, nvmlError(fmt.Sprintf("GPU %d handle", i), r)
		}
		uuid, r := dev.GetUUID()
		if r != nvml.SUCCESS {
			return nil, nil, nvmlError(fmt.Sprintf("GPU %d UUID", i), r)
		}
		procs, r := dev.GetComputeRunningProcesses()
		if r != nvml.SUCCESS {
			return nil, nil, nvmlError(fmt.Sprintf("GPU %d compute processes", i), r)
		}
		for _, p := range procs {
			pid := int(p.Pid)
			if !wanted[pid] {
				continue
			}
			gp := found[pid]
			if gp == nil {
				gp = &gpu.Process{PID: pid}
				found[pid] = gp
			}
			if !slices.Contains(gp.Devices, uuid) {
				gp.Devices = append(gp.Devices, uuid)
			}
			if p.UsedGpuMemory != ^uint64(0) { // NVML_VALUE_NOT_AVAILABLE, e.g. without permission
				gp.MemoryBytes += p.UsedGpuMemory
				if gp.DeviceMemory == nil {
					gp.DeviceMemory = map[string]uint64{}
				}
				gp.DeviceMemory[uuid] += p.UsedGpuMemory
			}
		}
	}
	var out []gpu.Process
	var holders []holder
	for _, pid := range pids {
		if gp := found[pid]; gp != nil {
			out = append(out, *gp)
			delete(found, pid) // a pid listed twice is reported once
			continue
		}
		holds, err := holdsDeviceFiles(tree, pid)
		if err != nil {
			return nil, nil, err
		}
		if !holds {
			continue
		}
		// Not listed by NVML: the driver must still know it, or it is a process that only
		// inherited the files, which the driver cannot checkpoint.
		_, err = b.cuda.State(pid)
		switch {
		case noContext(err):
			holders = append(holders, holder{pid: pid, refusal: noCUDAState(tree.Command(pid), pid, err)})
			continue
		case err != nil:
			return nil, nil, unknownCUDAState(tree.Command(pid), pid, err)
		}
		out = append(out, gpu.Process{PID: pid})
	}
	for i, h := range holders {
		holders[i].own = b.inherited(tree, h.pid, out)
	}
	return out, holders, nil
}

// inherited refuses holder unless each of its NVIDIA descriptors is an open file one of
// gpus (the tree's processes with CUDA state) holds too: what a child forked after its
// parent started CUDA holds, and never uses. A device it opened itself it may use, and
// reopened bare by the plugin it would fail the process after the restore.
func (b *Backend) inherited(tree *proctree.Snapshot, holder int, gpus []gpu.Process) error {
	theirs := map[int]map[int]string{}
	for _, g := range gpus {
		theirs[g.PID] = tree.Descriptors(g.PID, vendor.Holds)
	}
	for fd, path := range tree.Descriptors(holder, vendor.Holds) {
		if !b.sharedWithAny(holder, fd, path, theirs) {
			return ownDeviceFile(tree.Command(holder), holder, path)
		}
	}
	return nil
}

// sharedWithAny says whether descriptor fd (of path) of pid is one of the open files in
// theirs (by process, then descriptor).
func (b *Backend) sharedWithAny(pid, fd int, path string, theirs map[int]map[int]string) bool {
	for other, fds := range theirs {
		for ofd, opath := range fds {
			if opath != path {
				continue
			}
			if same, err := b.sameFile(pid, fd, other, ofd); err == nil && same {
				return true
			}
		}
	}
	return false
}

// ownDeviceFile is the refusal of a process holding an NVIDIA device file of its own
// without CUDA state.
func ownDeviceFile(command string, pid int, path string) error {
	return &safety.Finding{
		Check: safety.CheckNoCUDAState, PID: pid, Command: command,
		Reason: fmt.Sprintf("holds %s, opened by itself and not inherited from a GPU process of the tree, without CUDA state the driver can checkpoint: restored, it would hold the device again without the driver's state it had", path),
		Fix:    "leave it out of the tree (checkpoint the GPU process's own subtree), or stop it before the checkpoint and start it again after the restore",
	}
}

// noContext says whether the driver's answer to asking pid's state is that pid has no CUDA
// context: CUDA_ERROR_NOT_INITIALIZED, what it answers for a child forked after its parent
// started CUDA (device run 12, driver 580). Any other failure leaves it unknown whether the
// process holds device state, which carrying its files as stateless would lose.
func noContext(err error) bool {
	var ce *cuda.Error
	return errors.As(err, &ce) && ce.Code == cudaErrorNotInitialized
}

// cudaErrorNotInitialized is CUDA_ERROR_NOT_INITIALIZED.
const cudaErrorNotInitialized = 3

// unknownCUDAState is the refusal of a process holding NVIDIA device files whose CUDA state
// the driver could not tell: it may hold a context the driver would not checkpoint.
func unknownCUDAState(command string, pid int, cause error) error {
	return &safety.Finding{
		Check: safety.CheckNoCUDAState, PID: pid, Command: command,
		Reason: fmt.Sprintf("holds NVIDIA device files, NVML does not list it, and the driver could not tell its CUDA state (%v): device state it may hold would not be checkpointed", cause),
		Fix:    "checkpoint once the driver answers for it (a process NVML lists, or a child forked after its parent started CUDA, is checkpointed)",
	}
}

// noCUDAState is the refusal of a process that holds NVIDIA device files without CUDA state
// of its own: typically a child forked after its parent started CUDA, which inherits the
// open files but no context.
func noCUDAState(command string, pid int, cause error) error {
	return &safety.Finding{
		Check: safety.CheckNoCUDAState, PID: pid, Command: command,
		Reason: fmt.Sprintf("holds NVIDIA device files but has no CUDA state the driver can checkpoint (%v), and CRIU dumps those files only with gpucr's CRIU plugin (%s), not installed beside this CRIU", cause, FilePluginFile),
		Fix:    "install it with scripts/install-deps.sh (a child forked after its parent started CUDA, as PyTorch DataLoader workers are by default, is such a process)",
	}
}

// deviceFile matches the NVIDIA device files a CUDA context holds open: the control
// device and the per-GPU ones (not nvidia-uvm, nvidia-modeset or nvidia-caps).
var deviceFile = regexp.MustCompile(`^/dev/nvidia([0-9]+|ctl)$`)

// holdsDeviceFiles reports whether pid has an NVIDIA device file open. A process that is
// gone holds nothing; one whose fds cannot be read is an error, since guessing "no" would
// send device state to CRIU, which cannot dump it.
func holdsDeviceFiles(tree *proctree.Snapshot, pid int) (bool, error) {
	files, err := tree.Files(pid)
	if err != nil {
		return false, fmt.Errorf("look for NVIDIA device files: %w", err)
	}
	return slices.ContainsFunc(files, deviceFile.MatchString), nil
}

// Lock implements gpu.Backend. A timeout of zero or less waits without limit.
func (b *Backend) Lock(_ context.Context, pid int, timeout time.Duration) error {
	return b.cuda.Lock(pid, timeout)
}

// Checkpoint implements gpu.Backend.
func (b *Backend) Checkpoint(_ context.Context, pid int) error { return b.cuda.Checkpoint(pid) }

// Unlock implements gpu.Backend.
func (b *Backend) Unlock(_ context.Context, pid int) error { return b.cuda.Unlock(pid) }

// Restore implements gpu.Backend. The driver takes a remapping only as a permutation of
// the GPUs, so the moves are completed into one first.
func (b *Backend) Restore(_ context.Context, pid int, remap map[string]string) error {
	var pairs []cuda.GPUPair
	if len(remap) > 0 {
		uuids, err := b.uuids()
		if err != nil {
			return err
		}
		if pairs, err = driverPairs(remap, uuids); err != nil {
			return err
		}
	}
	// The driver restores only with persistence mode on or CUDA initialized in the calling
	// process, so gpucr initializes it; under persistence mode a failure here is harmless.
	initErr := b.cuda.Init()
	if err := b.cuda.Restore(pid, pairs); err != nil {
		if initErr != nil {
			return fmt.Errorf("%w (and cuInit in gpucr failed: %v)", err, initErr)
		}
		return err
	}
	return nil
}

// driverPairs turns moves (image GPU UUID -> host GPU UUID) into the pairs the driver's
// restore takes, over this host's GPUs (host, in index order): their permutation, each
// UUID in the driver's binary form.
func driverPairs(moves map[string]string, host []string) ([]cuda.GPUPair, error) {
	perm, err := permutation(moves, host)
	if err != nil {
		return nil, fmt.Errorf("GPU remap: %w", err)
	}
	pairs := make([]cuda.GPUPair, 0, len(perm))
	for _, p := range perm {
		old, err := cuda.ParseUUID(p[0])
		if err != nil {
			return nil, fmt.Errorf("GPU remap: %w", err)
		}
		dst, err := cuda.ParseUUID(p[1])
		if err != nil {
			return nil, fmt.Errorf("GPU remap: %w", err)
		}
		pairs = append(pairs, cuda.GPUPair{Old: old, New: dst})
	}
	return pairs, nil
}

// uuids lists this host's GPU UUIDs in index order.
func (b *Backend) uuids() ([]string, error) {
	n, r := b.nvml.DeviceGetCount()
	if r != nvml.SUCCESS {
		return nil, nvmlError("device count", r)
	}
	uuids := make([]string, n)
	for i := range n {
		dev, r := b.nvml.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			return nil, nvmlError(fmt.Sprintf("GPU %d handle", i), r)
		}
		if uuids[i], r = dev.GetUUID(); r != nvml.SUCCESS {
			return nil, nvmlError(fmt.Sprintf("GPU %d UUID", i), r)
		}
	}
	return uuids, nil
}

// permutation turns moves (checkpointed GPU UUID -> host GPU UUID) into the driver's GPU
// pairs, sorted by old UUID. Driver 580 refuses pairs that leave out a GPU of the host
// (CUDA_ERROR_INVALID_VALUE, even for a process that saw only one GPU) or put two on one,
// so each host GPU not moved gets a pair too: itself if no GPU moves onto it, else a host
// GPU left free, in host order. A host GPU gets none only when moves from GPUs of another
// host have taken every free one; those GPUs were not checkpointed here.
func permutation(moves map[string]string, host []string) ([][2]string, error) {
	to := map[string]string{}
	taken := map[string]string{} // host GPU -> the GPU moving onto it
	for _, old := range slices.Sorted(maps.Keys(moves)) {
		dst := moves[old]
		if !slices.Contains(host, dst) {
			return nil, fmt.Errorf("GPU %s is not on this host", dst)
		}
		if prev, dup := taken[dst]; dup {
			return nil, fmt.Errorf("GPUs %s and %s both go to %s", prev, old, dst)
		}
		to[old], taken[dst] = dst, old
	}
	for _, h := range host {
		_, moved := to[h]
		if _, busy := taken[h]; !moved && !busy {
			to[h], taken[h] = h, h
		}
	}
	free := slices.DeleteFunc(slices.Clone(host), func(h string) bool { _, busy := taken[h]; return busy })
	for _, h := range host {
		if _, moved := to[h]; moved || len(free) == 0 {
			continue
		}
		to[h], free = free[0], free[1:]
	}
	pairs := make([][2]string, 0, len(to))
	for _, old := range slices.Sorted(maps.Keys(to)) {
		pairs = append(pairs, [2]string{old, to[old]})
	}
	return pairs, nil
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
	case cuda.StateFailed:
		return gpu.StateFailed, nil
	}
	return gpu.StateFailed, fmt.Errorf("the CUDA driver reports pid %d in unknown checkpoint state %d", pid, st)
}
