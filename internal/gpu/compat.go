package gpu

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Check is one restore compatibility check. Like the KFD_*_CHECK switches of AMD's CRIU
// plugin, each is on by default: a user who knows better switches it off by name or by Env.
type Check struct {
	Name string // for --skip-check
	Env  string // setting it to 0 switches the check off too
	Doc  string
}

// Names of the checks.
const (
	checkDriver  = "driver-version"
	checkCompute = "compute-capability"
	checkMemory  = "memory"
	checkModel   = "model"
	checkL2      = "l2-cache"
	checkNUMA    = "numa"
)

var checks = []Check{
	{checkDriver, "NV_DRIVER_VER_CHECK", "the host's driver is at least as new as the image's"},
	{checkCompute, "NV_COMPUTE_CAP_CHECK", "each GPU has the compute capability of the image GPU it takes"},
	{checkMemory, "NV_MEMORY_CHECK", "each GPU has at least as much memory as its image GPU had in use"},
	{checkModel, "NV_MODEL_CHECK", "each GPU is the same model as its image GPU"},
	{checkL2, "NV_L2_CHECK", "each GPU has the L2 cache size of its image GPU"},
	{checkNUMA, "NV_NUMA_CHECK", "GPUs that shared a NUMA node still do, and GPUs that did not still do not"},
}

// Checks lists the compatibility checks in the order they run.
func Checks() []Check { return slices.Clone(checks) }

func checkNamed(name string) Check {
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	panic("gpu: no check named " + name)
}

// Skips holds the names of the checks switched off.
type Skips map[string]bool

// SkipsFrom collects the checks switched off by --skip-check names (flags) and by their
// environment variables set to 0 (read through getenv, os.Getenv outside tests).
func SkipsFrom(flags []string, getenv func(string) string) (Skips, error) {
	s := Skips{}
	for _, c := range checks {
		if getenv(c.Env) == "0" {
			s[c.Name] = true
		}
	}
	for _, f := range flags {
		if !slices.ContainsFunc(checks, func(c Check) bool { return c.Name == f }) {
			names := make([]string, len(checks))
			for i, c := range checks {
				names[i] = c.Name
			}
			return nil, fmt.Errorf("unknown check %q for --skip-check; the checks are %s", f, strings.Join(names, ", "))
		}
		s[f] = true
	}
	return s, nil
}

// ErrIncompatible means this host's GPUs cannot take an image's device state; every
// *IncompatibleError matches it with errors.Is.
var ErrIncompatible = errors.New("incompatible GPU")

// IncompatibleError is one failed check, worded so the user sees what differs and how to
// switch the check off when they know the restore will work anyway.
type IncompatibleError struct {
	Check    string // the check's name, as --skip-check takes it
	Env      string // the check's environment switch
	Device   string // which GPU, e.g. "GPU 0 (GPU-…)", or "driver"
	Property string // what is wrong, e.g. "compute capability differs"
	Image    string // the image's value
	Host     string // this host's value
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("%s: %s: image %s, host %s (skip with --skip-check %s or %s=0)",
		e.Device, e.Property, e.Image, e.Host, e.Check, e.Env)
}

// Is makes errors.Is(err, ErrIncompatible) true.
func (e *IncompatibleError) Is(target error) bool { return target == ErrIncompatible }

func incompatible(check, device, property, image, host string) *IncompatibleError {
	c := checkNamed(check)
	return &IncompatibleError{Check: c.Name, Env: c.Env, Device: device, Property: property, Image: image, Host: host}
}

func gpuName(d Device) string { return fmt.Sprintf("GPU %d (%s)", d.Index, d.UUID) }

// placement names an image GPU and the host GPU it would go to, as one GPU if it stays.
func placement(img, host Device) string {
	if img.UUID == host.UUID {
		return gpuName(host)
	}
	return "image " + gpuName(img) + " on host " + gpuName(host)
}

// deviceChecks runs the enabled per-device checks of img going to host, in Checks order.
// An L2 size of 0 is unknown (the backend could not read it) and not compared.
func deviceChecks(img, host Device, skips Skips) error {
	where := placement(img, host)
	switch {
	case !skips[checkCompute] && img.ComputeCapability != host.ComputeCapability:
		return incompatible(checkCompute, where, "compute capability differs", img.ComputeCapability, host.ComputeCapability)
	case !skips[checkMemory] && host.MemoryTotal < img.MemoryUsed:
		return incompatible(checkMemory, where, "not enough memory", gib(img.MemoryUsed)+" in use", gib(host.MemoryTotal)+" in all")
	case !skips[checkModel] && img.Name != host.Name:
		return incompatible(checkModel, where, "model differs", img.Name, host.Name)
	case !skips[checkL2] && img.L2CacheBytes != 0 && host.L2CacheBytes != 0 && img.L2CacheBytes != host.L2CacheBytes:
		return incompatible(checkL2, where, "L2 cache size differs", mib(img.L2CacheBytes), mib(host.L2CacheBytes))
	}
	return nil
}

func gib(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<30), 'f', 1, 64) + " GiB" }
func mib(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', -1, 64) + " MiB" }

// numaConflict reports whether placing image GPUs a and b on host GPUs ha and hb changes
// whether they share a NUMA node. A node of -1 is unknown and conflicts with nothing.
func numaConflict(a, b, ha, hb Device) bool {
	if a.NUMANode < 0 || b.NUMANode < 0 || ha.NUMANode < 0 || hb.NUMANode < 0 {
		return false
	}
	return (a.NUMANode == b.NUMANode) != (ha.NUMANode == hb.NUMANode)
}

func numaError(a, b, ha, hb Device) error {
	return incompatible(checkNUMA,
		fmt.Sprintf("image GPUs %d and %d on host GPUs %d and %d", a.Index, b.Index, ha.Index, hb.Index),
		"NUMA grouping differs", numaNodes(a, b), numaNodes(ha, hb))
}

func numaNodes(a, b Device) string {
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
// UUID; an empty spec gives nil.
func ParseGPUMap(spec string, image, host Host) (map[string]string, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	out := map[string]string{}
	onto := map[string]Device{} // host UUID -> the image GPU mapped onto it
	for _, pair := range strings.Split(spec, ",") {
		oldRef, newRef, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("--gpu-map %q: want OLD=NEW pairs such as 0=1 or GPU-…=GPU-…", strings.TrimSpace(pair))
		}
		old, err := findDevice(image, oldRef)
		if err != nil {
			return nil, fmt.Errorf("--gpu-map: the image has %w", err)
		}
		dst, err := findDevice(host, newRef)
		if err != nil {
			return nil, fmt.Errorf("--gpu-map: this host has %w", err)
		}
		if _, dup := out[old.UUID]; dup {
			return nil, fmt.Errorf("--gpu-map maps image %s twice", gpuName(old))
		}
		if prev, dup := onto[dst.UUID]; dup {
			return nil, fmt.Errorf("--gpu-map puts image GPUs %d and %d both on host %s", prev.Index, old.Index, gpuName(dst))
		}
		out[old.UUID], onto[dst.UUID] = dst.UUID, old
	}
	return out, nil
}

// findDevice finds the device of h that ref names by index or UUID. A ref that is the
// UUID of one device and the index of another (an image may carry any UUID) is refused.
func findDevice(h Host, ref string) (Device, error) {
	ref = strings.TrimSpace(ref)
	var found []Device
	for _, d := range h.Devices {
		if d.UUID == ref || strconv.Itoa(d.Index) == ref {
			found = append(found, d)
		}
	}
	switch len(found) {
	case 0:
		return Device{}, fmt.Errorf("no GPU %q", ref)
	case 1:
		return found[0], nil
	}
	return Device{}, fmt.Errorf("two GPUs named %q (the index of one, the UUID of another): name it by the other form", ref)
}

// PlanMapping decides which host GPU takes each image GPU. GPUs the image's processes used
// go where explicit says, else stay on the same GPU if this host has it, else go to free
// host GPUs that pass every enabled check (the first such choice in index order). Every
// enabled check must pass, or an *IncompatibleError says which and how to skip it. The
// other image GPUs then take the remaining host GPUs, unchecked, because the driver wants
// a home for every GPU of the checkpoint. The result holds only GPUs that move (image UUID
// -> host UUID); nil means all stay where they were.
func PlanMapping(image Snapshot, host Host, explicit map[string]string, skips Skips) (map[string]string, error) {
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
	image, host []Device
	used        map[string]bool   // image UUIDs the processes used
	plan        map[string]Device // image UUID -> host device
	taken       map[string]bool   // host UUIDs in plan
	missing     []Device          // used image devices still without a host device
	skips       Skips
}

func newPlanner(image Snapshot, host Host, explicit map[string]string, skips Skips) (*planner, error) {
	p := &planner{
		image: byIndex(image.Devices), host: byIndex(host.Devices),
		used: map[string]bool{}, plan: map[string]Device{}, taken: map[string]bool{}, skips: skips,
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

func byIndex(ds []Device) []Device {
	ds = slices.Clone(ds)
	slices.SortStableFunc(ds, func(a, b Device) int { return a.Index - b.Index })
	return ds
}

func (p *planner) hostDevice(uuid string) (Device, bool) {
	i := slices.IndexFunc(p.host, func(d Device) bool { return d.UUID == uuid })
	if i < 0 {
		return Device{}, false
	}
	return p.host[i], true
}

func (p *planner) assign(img, host Device) {
	p.plan[img.UUID] = host
	p.taken[host.UUID] = true
}

func (p *planner) unassign(img Device) {
	delete(p.taken, p.plan[img.UUID].UUID)
	delete(p.plan, img.UUID)
}

// checkPlaced runs every enabled check on the used GPUs placed so far.
func (p *planner) checkPlaced() error {
	var placed []Device
	for _, d := range p.image {
		if h, ok := p.plan[d.UUID]; ok && p.used[d.UUID] {
			if err := deviceChecks(d, h, p.skips); err != nil {
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
			err := deviceChecks(d, h, p.skips)
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
	return fmt.Errorf("%w: this host lacks image %s and has too few free GPUs that pass the checks", ErrIncompatible, strings.Join(names, ", "))
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
		twin := fmt.Sprintf("%q %q %d %d %d", h.Name, h.ComputeCapability, h.MemoryTotal, h.L2CacheBytes, h.NUMANode)
		if p.taken[h.UUID] || tried[twin] || deviceChecks(d, h, p.skips) != nil || p.numaConflicts(d, h) {
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
func (p *planner) numaConflicts(d, h Device) bool {
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
		if i := slices.IndexFunc(p.host, func(h Device) bool { return !p.taken[h.UUID] }); i >= 0 {
			p.assign(d, p.host[i])
		}
	}
}
