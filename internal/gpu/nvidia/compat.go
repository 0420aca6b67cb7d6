package nvidia

import (
	"context"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpucr/gpucr/internal/gpu"
	gpucrimage "github.com/gpucr/gpucr/internal/image"
)

// Names of the checks.
const (
	checkDriver  = "driver-version"
	checkCompute = "compute-capability"
	checkMemory  = "memory"
	checkModel   = "model"
	checkL2      = "l2-cache"
	checkNUMA    = "numa"
)

// checks are the NVIDIA backend's restore checks, in the order they run.
var checks = []gpu.Check{
	{Name: checkDriver, Env: "NV_DRIVER_VER_CHECK", Doc: "the host's driver is at least as new as the image's"},
	{Name: checkCompute, Env: "NV_COMPUTE_CAP_CHECK", Doc: "each GPU has the compute capability of the image GPU it takes"},
	{Name: checkMemory, Env: "NV_MEMORY_CHECK", Doc: "each GPU has free as much memory as the image's processes held on its image GPU"},
	{Name: checkModel, Env: "NV_MODEL_CHECK", Doc: "each GPU is the same model as its image GPU"},
	{Name: checkL2, Env: "NV_L2_CHECK", Doc: "each GPU has the L2 cache size of its image GPU"},
	{Name: checkNUMA, Env: "NV_NUMA_CHECK", Doc: "GPUs that shared a NUMA node still do, and GPUs that did not still do not"},
}

// The backend's own facts about devices and hosts, as gpu.Properties names them.
const (
	propCompute = "computeCapability"
	propL2      = "l2CacheBytes"
	propMIG     = "migMode"
	propECC     = "eccMode"
	propCUDA    = "cudaVersion"
)

// Skips holds the names of the backend's checks switched off.
type Skips map[string]bool

func incompatible(check, device, property, image, host string) *gpu.IncompatibleError {
	i := slices.IndexFunc(checks, func(c gpu.Check) bool { return c.Name == check })
	return gpu.Incompatible(checks[i], device, property, image, host)
}

// PlanRestore checks that this host's GPUs (those the restored processes can reach, where
// in.Root says) can take the image's NVIDIA state and decides which GPU takes each image
// GPU: where --gpu-map says, else PlanMapping's choice.
func (b *Backend) PlanRestore(ctx context.Context, in gpu.RestoreInput) (*gpu.Plan, error) {
	if err := unlistedRecords(in); err != nil {
		return nil, err
	}
	if in.Snapshot == nil {
		return nil, nil
	}
	host, err := b.Host(ctx)
	if err != nil {
		return nil, fmt.Errorf("describe GPUs: %w", err)
	}
	all := host
	if in.Root != "" {
		if host, err = b.reachable(host, in.Root); err != nil {
			return nil, err
		}
	}
	explicit, err := ParseGPUMap(in.GPUMap, in.Snapshot.Host, host)
	if err != nil {
		return nil, err
	}
	remap, err := PlanMapping(*in.Snapshot, host, explicit, Skips(in.Skips.For(Name)))
	if err != nil {
		return nil, err
	}
	// What Restore will give the driver is checked now, before anything is restored: an
	// image GPU's UUID not in NVML's form was refused only once CRIU had restored the tree
	// (hostile test).
	if len(remap) > 0 {
		if _, err := driverPairs(remap, uuidsOf(all)); err != nil {
			return nil, fmt.Errorf("the image's GPUs cannot move onto this host's: %w", err)
		}
	}
	plan := &gpu.Plan{Remap: remap}
	if len(in.Snapshot.FileHolders) > 0 {
		// CRIU opens those processes' device files again only through gpucr's plugin.
		if b.filePlugin == "" {
			return nil, fmt.Errorf("%w: the image's process %d held NVIDIA device files without CUDA state, which only gpucr's CRIU plugin (%s) opens again, and it is not installed beside this CRIU: install it with scripts/install-deps.sh",
				gpu.ErrIncompatible, in.Snapshot.FileHolders[0], FilePluginFile)
		}
		plan.PluginDir = b.filePlugin
	}
	return plan, nil
}

// unlistedRecords refuses an image whose CRIU files hold records of gpucr's CRIU plugin
// while its GPU record lists no process whose device files the plugin carries: the restore
// would not load the plugin, and CRIU would fail on those files midway ("Unable to restore",
// hostile test). gpucr writes neither without the other.
func unlistedRecords(in gpu.RestoreInput) error {
	if in.CRIUDir == "" || (in.Snapshot != nil && len(in.Snapshot.FileHolders) > 0) {
		return nil
	}
	held, _ := filepath.Glob(filepath.Join(in.CRIUDir, FileRecordPattern))
	if len(held) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the image's CRIU files hold %s, a record of gpucr's CRIU plugin, and its GPU record lists no process whose device files the plugin carries: the image was changed after its checkpoint",
		gpucrimage.ErrCorrupt, filepath.Base(held[0]))
}

// uuidsOf lists the UUIDs of h's GPUs in index order, as Restore reads them from NVML.
func uuidsOf(h gpu.Host) []string {
	out := make([]string, len(h.Devices))
	for i, d := range byIndex(h.Devices) {
		out[i] = d.UUID
	}
	return out
}

func gpuName(d gpu.Device) string { return fmt.Sprintf("GPU %d (%s)", d.Index, d.UUID) }

// placement names an image GPU and the host GPU it would go to, as one GPU if it stays.
func placement(img, host gpu.Device) string {
	if img.UUID == host.UUID {
		return gpuName(host)
	}
	return "image " + gpuName(img) + " on host " + gpuName(host)
}

// deviceChecks runs the enabled per-device checks of img going to host, in Checks order.
// An L2 size of 0 is unknown (the backend could not read it) and not compared.
func (p *planner) deviceChecks(img, host gpu.Device) error {
	where, skips := placement(img, host), p.skips
	need, free := p.need[img.UUID], freeMemory(host)
	switch {
	case !skips[checkCompute] && img.Properties[propCompute] != host.Properties[propCompute]:
		return incompatible(checkCompute, where, "compute capability differs", img.Properties[propCompute], host.Properties[propCompute])
	case !skips[checkMemory] && need > free:
		return incompatible(checkMemory, where, "not enough free memory (free some there, or move it with --gpu-map)",
			gib(need)+" held by its processes", gib(free)+" free of "+gib(host.MemoryTotal))
	case !skips[checkModel] && img.Name != host.Name:
		return incompatible(checkModel, where, "model differs", img.Name, host.Name)
	case !skips[checkL2] && l2(img) != 0 && l2(host) != 0 && l2(img) != l2(host):
		return incompatible(checkL2, where, "L2 cache size differs", mib(l2(img)), mib(l2(host)))
	}
	return nil
}

// freeMemory is what d has free now: its total less what every process on it uses.
func freeMemory(d gpu.Device) uint64 { return d.MemoryTotal - min(d.MemoryUsed, d.MemoryTotal) }

// memoryNeeds sums, by image GPU, the device memory the image's processes held there:
// what the driver's restore allocates again. Images before the per-GPU record have only
// each process's sum, split evenly here over the GPUs it used. Sums saturate, so a crafted
// image cannot wrap them small.
func memoryNeeds(procs []gpu.Process) map[string]uint64 {
	need := map[string]uint64{}
	add := func(uuid string, b uint64) {
		if need[uuid] > math.MaxUint64-b {
			need[uuid] = math.MaxUint64
			return
		}
		need[uuid] += b
	}
	for _, proc := range procs {
		for _, u := range proc.Devices {
			if proc.DeviceMemory != nil {
				add(u, proc.DeviceMemory[u])
			} else {
				add(u, proc.MemoryBytes/uint64(len(proc.Devices)))
			}
		}
	}
	return need
}

func l2(d gpu.Device) uint64 { return d.Properties.Uint(propL2) }

func gib(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<30), 'f', 1, 64) + " GiB" }
func mib(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', -1, 64) + " MiB" }

// numaConflict reports whether placing image GPUs a and b on host GPUs ha and hb changes
// whether they share a NUMA node. A node of -1 is unknown and conflicts with nothing.
func numaConflict(a, b, ha, hb gpu.Device) bool {
	if a.NUMANode < 0 || b.NUMANode < 0 || ha.NUMANode < 0 || hb.NUMANode < 0 {
		return false
	}
	return (a.NUMANode == b.NUMANode) != (ha.NUMANode == hb.NUMANode)
}

func numaError(a, b, ha, hb gpu.Device) error {
	return incompatible(checkNUMA,
		fmt.Sprintf("image GPUs %d and %d on host GPUs %d and %d", a.Index, b.Index, ha.Index, hb.Index),
		"NUMA grouping differs", numaNodes(a, b), numaNodes(ha, hb))
}

func numaNodes(a, b gpu.Device) string {
	if a.NUMANode == b.NUMANode {
		return fmt.Sprintf("both on node %d", a.NUMANode)
	}
	return fmt.Sprintf("on nodes %d and %d", a.NUMANode, b.NUMANode)
}

// compareVersions compares dotted numeric versions such as "580.159.04" part by part as
// numbers (so "580.65" < "580.159"); a missing or non-numeric part counts as 0.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

// ParseGPUMap reads a --gpu-map spec: comma-separated OLD=NEW pairs, where OLD is an
// image GPU and NEW a host GPU, each given by index or UUID. It returns image UUID -> host
// UUID; an empty spec gives nil. Its errors match gpu.ErrBadGPUMap.
func ParseGPUMap(spec string, image, host gpu.Host) (map[string]string, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	out := map[string]string{}
	onto := map[string]gpu.Device{} // host UUID -> the image GPU mapped onto it
	for _, pair := range strings.Split(spec, ",") {
		oldRef, newRef, ok := strings.Cut(pair, "=")
		if !ok || strings.TrimSpace(oldRef) == "" || strings.TrimSpace(newRef) == "" {
			return nil, fmt.Errorf("%w %q: want OLD=NEW pairs such as 0=1 or GPU-…=GPU-…", gpu.ErrBadGPUMap, strings.TrimSpace(pair))
		}
		old, err := findDevice(image, oldRef)
		if err != nil {
			return nil, fmt.Errorf("%w: the image has %w", gpu.ErrBadGPUMap, err)
		}
		dst, err := findDevice(host, newRef)
		if err != nil {
			return nil, fmt.Errorf("%w: this host has %w", gpu.ErrBadGPUMap, err)
		}
		if _, dup := out[old.UUID]; dup {
			return nil, fmt.Errorf("%w maps image %s twice", gpu.ErrBadGPUMap, gpuName(old))
		}
		if prev, dup := onto[dst.UUID]; dup {
			return nil, fmt.Errorf("%w puts image GPUs %d and %d both on host %s", gpu.ErrBadGPUMap, prev.Index, old.Index, gpuName(dst))
		}
		out[old.UUID], onto[dst.UUID] = dst.UUID, old
	}
	return out, nil
}

// findDevice finds the device of h that ref names by index or UUID. A ref that is the
// UUID of one device and the index of another (an image may carry any UUID) is refused.
func findDevice(h gpu.Host, ref string) (gpu.Device, error) {
	ref = strings.TrimSpace(ref)
	var found []gpu.Device
	for _, d := range h.Devices {
		if d.UUID == ref || strconv.Itoa(d.Index) == ref {
			found = append(found, d)
		}
	}
	switch len(found) {
	case 0:
		return gpu.Device{}, fmt.Errorf("no GPU %q", ref)
	case 1:
		return found[0], nil
	}
	return gpu.Device{}, fmt.Errorf("two GPUs named %q (the index of one, the UUID of another): name it by the other form", ref)
}

// PlanMapping decides which host GPU takes each image GPU. GPUs the image's processes used
// go where explicit says, else stay on the same GPU if this host has it, else go to free
// host GPUs that pass every enabled check (the first such choice in index order). Every
// enabled check must pass, or an *IncompatibleError says which and how to skip it. The
// other image GPUs then take the remaining host GPUs, unchecked, because the driver wants
// a home for every GPU of the checkpoint. The result holds only GPUs that move (image UUID
// -> host UUID); nil means all stay where they were.
func PlanMapping(image gpu.Snapshot, host gpu.Host, explicit map[string]string, skips Skips) (map[string]string, error) {
	if !skips[checkDriver] && compareVersions(host.DriverVersion, image.DriverVersion) < 0 {
		return nil, incompatible(checkDriver, "GPU driver", "version older than the image's", image.DriverVersion, host.DriverVersion)
	}
	p, err := newPlanner(image, host, explicit, skips)
	if err != nil {
		return nil, err
	}
	if err := p.checkPlaced(); err != nil {
		return nil, err
	}
	if err := p.placeMissing(); err != nil {
		return nil, err
	}
	p.placeUnused()
	var moves map[string]string
	for old, dst := range p.plan {
		if old != dst.UUID {
			if moves == nil {
				moves = map[string]string{}
			}
			moves[old] = dst.UUID
		}
	}
	return moves, nil
}

// planner holds a mapping under construction. Devices are kept in index order so that
// every choice is deterministic.
type planner struct {
	image, host []gpu.Device
	used        map[string]bool       // image UUIDs the processes used
	need        map[string]uint64     // image UUID -> device memory its processes held there
	plan        map[string]gpu.Device // image UUID -> host device
	taken       map[string]bool       // host UUIDs in plan
	missing     []gpu.Device          // used image devices still without a host device
	skips       Skips
}

func newPlanner(image gpu.Snapshot, host gpu.Host, explicit map[string]string, skips Skips) (*planner, error) {
	p := &planner{
		image: byIndex(image.Devices), host: byIndex(host.Devices),
		used: map[string]bool{}, plan: map[string]gpu.Device{}, taken: map[string]bool{}, skips: skips,
		need: memoryNeeds(image.Processes),
	}
	imageUUIDs := map[string]bool{}
	for _, d := range p.image {
		imageUUIDs[d.UUID] = true
	}
	for _, proc := range image.Processes {
		for _, u := range proc.Devices {
			if !imageUUIDs[u] {
				return nil, fmt.Errorf("image process %d used GPU %s, which the image does not describe", proc.PID, u)
			}
			p.used[u] = true
		}
	}
	for _, old := range slices.Sorted(maps.Keys(explicit)) {
		if !imageUUIDs[old] {
			return nil, fmt.Errorf("GPU map moves GPU %s, which the image does not have", old)
		}
	}
	for _, d := range p.image { // explicit choices first, so no default takes their GPUs
		dst, ok := explicit[d.UUID]
		if !ok {
			continue
		}
		h, found := p.hostDevice(dst)
		if !found {
			return nil, fmt.Errorf("GPU map sends image %s to %s, which this host does not have", gpuName(d), dst)
		}
		if p.taken[dst] {
			return nil, fmt.Errorf("GPU map sends two image GPUs to host %s", gpuName(h))
		}
		p.assign(d, h)
	}
	for _, d := range p.image {
		if _, ok := p.plan[d.UUID]; ok || !p.used[d.UUID] {
			continue
		}
		if h, ok := p.hostDevice(d.UUID); ok && !p.taken[d.UUID] {
			p.assign(d, h)
		} else {
			p.missing = append(p.missing, d)
		}
	}
	return p, nil
}

func byIndex(ds []gpu.Device) []gpu.Device {
	ds = slices.Clone(ds)
	slices.SortStableFunc(ds, func(a, b gpu.Device) int { return a.Index - b.Index })
	return ds
}

func (p *planner) hostDevice(uuid string) (gpu.Device, bool) {
	i := slices.IndexFunc(p.host, func(d gpu.Device) bool { return d.UUID == uuid })
	if i < 0 {
		return gpu.Device{}, false
	}
	return p.host[i], true
}

func (p *planner) assign(img, host gpu.Device) {
	p.plan[img.UUID] = host
	p.taken[host.UUID] = true
}

func (p *planner) unassign(img gpu.Device) {
	delete(p.taken, p.plan[img.UUID].UUID)
	delete(p.plan, img.UUID)
}

// checkPlaced runs every enabled check on the used GPUs placed so far.
func (p *planner) checkPlaced() error {
	var placed []gpu.Device
	for _, d := range p.image {
		if h, ok := p.plan[d.UUID]; ok && p.used[d.UUID] {
			if err := p.deviceChecks(d, h); err != nil {
				return err
			}
			placed = append(placed, d)
		}
	}
	if p.skips[checkNUMA] {
		return nil
	}
	for i, a := range placed {
		for _, b := range placed[i+1:] {
			if ha, hb := p.plan[a.UUID], p.plan[b.UUID]; numaConflict(a, b, ha, hb) {
				return numaError(a, b, ha, hb)
			}
		}
	}
	return nil
}

// placeMissing finds homes for the used image GPUs this host lacks, or says why none fit.
func (p *planner) placeMissing() error {
	if p.search(0) {
		return nil
	}
	for _, d := range p.missing {
		var refusal error
		for _, h := range p.host {
			if p.taken[h.UUID] {
				continue
			}
			err := p.deviceChecks(d, h)
			if err == nil {
				refusal = nil
				break
			}
			if refusal == nil {
				refusal = err
			}
		}
		if refusal != nil {
			return fmt.Errorf("image %s is not on this host, and no free GPU here can take it; first refusal: %w", gpuName(d), refusal)
		}
	}
	if !p.skips[checkNUMA] {
		// Every GPU fits somewhere on its own; if they fit together once NUMA is ignored,
		// the grouping is what fails, and the check's own error says how to skip it.
		strict := p.skips
		p.skips = Skips{}
		maps.Copy(p.skips, strict)
		p.skips[checkNUMA] = true
		found := p.search(0)
		p.skips = strict
		if found {
			return fmt.Errorf("the image GPUs this host lacks cannot keep their NUMA grouping here: %w", p.checkPlaced())
		}
	}
	names := make([]string, len(p.missing))
	for i, d := range p.missing {
		names[i] = gpuName(d)
	}
	return fmt.Errorf("%w: this host lacks image %s and has too few free GPUs that pass the checks", gpu.ErrIncompatible, strings.Join(names, ", "))
}

// search places p.missing[i:] by backtracking over the free host GPUs in index order.
// Host GPUs alike in every checked property are tried once per position: if one cannot
// complete the mapping, neither can its twin, and skipping twins keeps the search small.
func (p *planner) search(i int) bool {
	if i == len(p.missing) {
		return true
	}
	d := p.missing[i]
	tried := map[string]bool{}
	for _, h := range p.host {
		twin := fmt.Sprintf("%q %q %d %d %d", h.Name, h.Properties[propCompute], freeMemory(h), l2(h), h.NUMANode)
		if p.taken[h.UUID] || tried[twin] || p.deviceChecks(d, h) != nil || p.numaConflicts(d, h) {
			continue
		}
		tried[twin] = true
		p.assign(d, h)
		if p.search(i + 1) {
			return true
		}
		p.unassign(d)
	}
	return false
}

// numaConflicts reports whether placing used image GPU d on h breaks the NUMA grouping
// with the used GPUs placed so far.
func (p *planner) numaConflicts(d, h gpu.Device) bool {
	if p.skips[checkNUMA] {
		return false
	}
	for _, e := range p.image {
		if he, ok := p.plan[e.UUID]; ok && p.used[e.UUID] && e.UUID != d.UUID && numaConflict(d, e, h, he) {
			return true
		}
	}
	return false
}

// placeUnused gives each image GPU the processes did not use a host GPU: its own if free,
// else the first free one. None is checked: no device state goes there.
func (p *planner) placeUnused() {
	for _, d := range p.image {
		if _, ok := p.plan[d.UUID]; ok {
			continue
		}
		if h, ok := p.hostDevice(d.UUID); ok && !p.taken[d.UUID] {
			p.assign(d, h)
			continue
		}
		if i := slices.IndexFunc(p.host, func(h gpu.Device) bool { return !p.taken[h.UUID] }); i >= 0 {
			p.assign(d, p.host[i])
		}
	}
}
