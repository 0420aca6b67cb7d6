package gpu

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Check is one restore compatibility check. Like the KFD_*_CHECK switches of AMD's CRIU
// plugin, each is on by default and can be switched off by --skip-check Name or Env=0.
type Check struct {
	Name string
	Env  string
	Doc  string
}

// Checks lists the NVIDIA compatibility checks in the order they run.
func Checks() []Check {
	return []Check{
		{"driver-version", "NV_DRIVER_VER_CHECK", "host driver version >= the image's"},
		{"compute-capability", "NV_COMPUTE_CAP_CHECK", "same compute capability"},
		{"memory", "NV_MEMORY_CHECK", "host GPU memory >= what the image used on it"},
		{"model", "NV_MODEL_CHECK", "same GPU model"},
		{"l2-cache", "NV_L2_CHECK", "same L2 cache size"},
		{"numa", "NV_NUMA_CHECK", "GPUs that shared a NUMA node still do, and others still do not"},
	}
}

// Skips names the checks switched off.
type Skips map[string]bool

// SkipsFrom collects the checks switched off by flag names or by their environment
// variables set to 0.
func SkipsFrom(flags []string, getenv func(string) string) (Skips, error) {
	s := Skips{}
	known := map[string]bool{}
	for _, c := range Checks() {
		known[c.Name] = true
		if getenv(c.Env) == "0" {
			s[c.Name] = true
		}
	}
	for _, f := range flags {
		if !known[f] {
			names := make([]string, 0, len(known))
			for _, c := range Checks() {
				names = append(names, c.Name)
			}
			return nil, fmt.Errorf("unknown check %q for --skip-check (known: %s)", f, strings.Join(names, ", "))
		}
		s[f] = true
	}
	return s, nil
}

// ErrIncompatible means this host's GPUs cannot take the image's device state.
var ErrIncompatible = errors.New("GPU is incompatible")

// IncompatibleError is one failed check, worded so the user knows what differs and how to
// switch the check off if they know better.
type IncompatibleError struct {
	Check, Env  string
	Device      string // "GPU 0 (GPU-…)" on the host
	Property    string
	Image, Host string
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("%s: %s differs: image %s, host %s (skip with --skip-check %s or %s=0)",
		e.Device, e.Property, e.Image, e.Host, e.Check, e.Env)
}

func (e *IncompatibleError) Is(target error) bool { return target == ErrIncompatible }

func checkByName(name string) Check {
	for _, c := range Checks() {
		if c.Name == name {
			return c
		}
	}
	panic("unknown check " + name)
}

func incompatible(check string, d Device, property, image, host string) error {
	c := checkByName(check)
	return &IncompatibleError{Check: c.Name, Env: c.Env, Device: fmt.Sprintf("GPU %d (%s)", d.Index, d.UUID),
		Property: property, Image: image, Host: host}
}

// deviceChecks compares one image device with the host device it would go to.
func deviceChecks(img, host Device, skips Skips) error {
	if !skips["compute-capability"] && img.ComputeCapability != host.ComputeCapability {
		return incompatible("compute-capability", host, "compute capability", img.ComputeCapability, host.ComputeCapability)
	}
	if !skips["memory"] && host.MemoryTotal < img.MemoryUsed {
		return incompatible("memory", host, "memory (host total below image used)", strconv.FormatUint(img.MemoryUsed, 10), strconv.FormatUint(host.MemoryTotal, 10))
	}
	if !skips["model"] && img.Name != host.Name {
		return incompatible("model", host, "model", img.Name, host.Name)
	}
	if !skips["l2-cache"] && img.L2CacheBytes != host.L2CacheBytes {
		return incompatible("l2-cache", host, "L2 cache size", strconv.FormatUint(img.L2CacheBytes, 10), strconv.FormatUint(host.L2CacheBytes, 10))
	}
	return nil
}

// CompareVersions compares dotted numeric versions ("580.159.04"): -1, 0 or 1.
func CompareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
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

// ParseGPUMap reads --gpu-map: comma-separated OLD=NEW pairs, each side a device index
// (the image's on the left, the host's on the right) or a UUID. It returns image UUID ->
// host UUID.
func ParseGPUMap(spec string, image, host Host) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(spec) == "" {
		return out, nil
	}
	taken := map[string]string{}
	for _, pair := range strings.Split(spec, ",") {
		old, new, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return nil, fmt.Errorf("--gpu-map %q: want OLD=NEW pairs like 0=1 or GPU-a=GPU-b", pair)
		}
		o, err := resolve(old, image, "image")
		if err != nil {
			return nil, err
		}
		n, err := resolve(new, host, "host")
		if err != nil {
			return nil, err
		}
		if prev, dup := taken[n]; dup && prev != o {
			return nil, fmt.Errorf("--gpu-map puts image GPUs %s and %s both on host GPU %s", prev, o, n)
		}
		taken[n] = o
		out[o] = n
	}
	return out, nil
}

func resolve(ref string, h Host, side string) (string, error) {
	ref = strings.TrimSpace(ref)
	for _, d := range h.Devices {
		if d.UUID == ref || strconv.Itoa(d.Index) == ref {
			return d.UUID, nil
		}
	}
	return "", fmt.Errorf("--gpu-map: the %s has no GPU %q", side, ref)
}

// PlanMapping decides where each image device in use goes: the user's explicit choice, else
// the same device if this host has it, else the lowest-index free host device that passes
// every enabled check. It then runs all enabled checks on the result. The returned map holds
// only devices that move (image UUID -> host UUID); nil means all stay where they were.
func PlanMapping(image Snapshot, host Host, explicit map[string]string, skips Skips) (map[string]string, error) {
	if !skips["driver-version"] && CompareVersions(host.DriverVersion, image.DriverVersion) < 0 {
		c := checkByName("driver-version")
		return nil, &IncompatibleError{Check: c.Name, Env: c.Env, Device: "driver", Property: "driver version (host older)",
			Image: image.DriverVersion, Host: host.DriverVersion}
	}
	byUUID := map[string]Device{}
	for _, d := range host.Devices {
		byUUID[d.UUID] = d
	}
	used := map[string]bool{}
	for _, p := range image.Processes {
		for _, u := range p.Devices {
			used[u] = true
		}
	}
	var need []Device
	for _, d := range image.Devices {
		if used[d.UUID] {
			need = append(need, d)
		}
	}
	sort.Slice(need, func(i, j int) bool { return need[i].Index < need[j].Index })

	plan := map[string]string{}
	taken := map[string]bool{}
	for _, d := range need { // explicit and same-device homes first, so automatic picks avoid them
		if n, ok := explicit[d.UUID]; ok {
			plan[d.UUID] = n
		} else if _, ok := byUUID[d.UUID]; ok {
			plan[d.UUID] = d.UUID
		}
		if n, ok := plan[d.UUID]; ok {
			taken[n] = true
		}
	}
	for _, d := range need {
		if _, ok := plan[d.UUID]; ok {
			continue
		}
		var firstErr error
		for _, h := range host.Devices {
			if taken[h.UUID] {
				continue
			}
			if err := deviceChecks(d, h, skips); err != nil {
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			plan[d.UUID], taken[h.UUID] = h.UUID, true
			break
		}
		if _, ok := plan[d.UUID]; !ok {
			if firstErr != nil {
				return nil, fmt.Errorf("image GPU %d (%s) is not on this host and no free GPU can take it: %w", d.Index, d.UUID, firstErr)
			}
			return nil, fmt.Errorf("%w: image GPU %d (%s) is not on this host and every GPU here is taken", ErrIncompatible, d.Index, d.UUID)
		}
	}
	for _, d := range need {
		if err := deviceChecks(d, byUUID[plan[d.UUID]], skips); err != nil {
			return nil, err
		}
	}
	if !skips["numa"] {
		if err := numaCheck(need, plan, byUUID); err != nil {
			return nil, err
		}
	}
	moved := map[string]string{}
	for o, n := range plan {
		if o != n {
			moved[o] = n
		}
	}
	if len(moved) == 0 {
		return nil, nil
	}
	return moved, nil
}

// numaCheck keeps the NUMA grouping of the image's devices: a job tuned for GPUs that share
// a memory node should not silently find them split, nor the reverse.
func numaCheck(need []Device, plan map[string]string, host map[string]Device) error {
	for i, a := range need {
		for _, b := range need[i+1:] {
			ha, hb := host[plan[a.UUID]], host[plan[b.UUID]]
			if (a.NUMANode == b.NUMANode) != (ha.NUMANode == hb.NUMANode) {
				return incompatible("numa", hb, fmt.Sprintf("NUMA placement relative to GPU %d", ha.Index),
					fmt.Sprintf("nodes %d,%d", a.NUMANode, b.NUMANode), fmt.Sprintf("nodes %d,%d", ha.NUMANode, hb.NUMANode))
			}
		}
	}
	return nil
}
