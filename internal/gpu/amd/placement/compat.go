// Package placement decides whether and where an AMD GPU checkpoint can be restored on
// this host, with the same checks and switches as AMD's CRIU plugin
// (criu-amdgpu-plugin(1)), so users of that plugin keep their muscle memory.
package placement

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/amd/kfd"
)

// Names of the switchable checks, as the skip list takes them.
const (
	CheckFW         = "fw-version"
	CheckSDMAFW     = "sdma-fw-version"
	CheckCaches     = "caches-count"
	CheckGWS        = "num-gws"
	CheckVRAM       = "vram-size"
	CheckNUMA       = "numa"
	CheckCapability = "capability"
)

// Names of the checks that cannot be switched off: the plugin cannot restore a GPU's
// state onto another model, nor keep peer-to-peer traffic working over other links.
const (
	checkModel = "model"
	checkLinks = "links"
)

// Checks lists the restore checks; a check without Env cannot be switched off. Like the
// plugin, a variable takes 0/no to switch its check off.
func Checks() []gpu.Check { return slices.Clone(checks) }

var checks = []gpu.Check{
	{Name: checkModel, Doc: "each GPU is the model of its image GPU (vendor, device ID, SIMD count)"},
	{Name: checkLinks, Doc: "GPUs linked by xGMI or PCIe in the image are linked the same way here"},
	{Name: CheckFW, Env: "KFD_FW_VER_CHECK", Doc: "each GPU's firmware version is at least its image GPU's"},
	{Name: CheckSDMAFW, Env: "KFD_SDMA_FW_VER_CHECK", Doc: "each GPU's SDMA firmware version is at least its image GPU's"},
	{Name: CheckCaches, Env: "KFD_CACHES_COUNT_CHECK", Doc: "each GPU has at least as many caches as its image GPU"},
	{Name: CheckGWS, Env: "KFD_NUM_GWS_CHECK", Doc: "each GPU has at least as many global wave syncs (num_gws) as its image GPU"},
	{Name: CheckVRAM, Env: "KFD_VRAM_SIZE_CHECK", Doc: "each GPU has at least as much VRAM as its image GPU"},
	{Name: CheckNUMA, Env: "KFD_NUMA_CHECK", Doc: "GPUs that shared a CPU NUMA region still do, and GPUs that did not still do not"},
	{Name: CheckCapability, Env: "KFD_CAPABILITY_CHECK", Doc: "each GPU's capability bits equal its image GPU's"},
}

// Skips holds the names of the checks switched off.
type Skips map[string]bool

func incompatible(check, device, property, image, host string) *gpu.IncompatibleError {
	i := slices.IndexFunc(checks, func(c gpu.Check) bool { return c.Name == check })
	return gpu.Incompatible(checks[i], device, property, image, host)
}

func placement(img, host kfd.Node) string {
	return fmt.Sprintf("image GPU %d on host GPU %d", img.GPUID, host.GPUID)
}

// deviceCheck runs the checks that concern one image GPU going to one host GPU, the model
// first and then the switchable ones in Checks order, and returns the first that fails.
// The model is what the plugin always compares (vendor, device ID, SIMD count); the
// firmware, cache, GWS and VRAM checks let the host have more, capability must be equal.
func deviceCheck(img, host kfd.Node, skips Skips) error {
	where := placement(img, host)
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	atLeast := []struct {
		check, prop string
		img, host   uint64
	}{
		{CheckFW, "fw_version", uint64(img.FWVersion), uint64(host.FWVersion)},
		{CheckSDMAFW, "sdma_fw_version", uint64(img.SDMAFWVersion), uint64(host.SDMAFWVersion)},
		{CheckCaches, "caches_count", uint64(img.CachesCount), uint64(host.CachesCount)},
		{CheckGWS, "num_gws", uint64(img.NumGWS), uint64(host.NumGWS)},
		{CheckVRAM, "VRAM bytes", img.LocalMemSize, host.LocalMemSize},
	}
	if m, h := Model(img), Model(host); m != h {
		return incompatible(checkModel, where, "model (vendor:device, SIMDs) must be equal", m, h)
	}
	for _, c := range atLeast {
		if !skips[c.check] && c.host < c.img {
			return incompatible(c.check, where, c.prop+" (host must be >= image)", u(c.img), u(c.host))
		}
	}
	if !skips[CheckCapability] && img.Capability != host.Capability {
		return incompatible(CheckCapability, where, "capability (must be equal)",
			fmt.Sprintf("%#x", img.Capability), fmt.Sprintf("%#x", host.Capability))
	}
	return nil
}

// Model names what the plugin always compares: vendor, device ID and SIMD count.
func Model(n kfd.Node) string {
	return fmt.Sprintf("%04x:%04x with %d SIMDs", n.VendorID, n.DeviceID, n.SIMDCount)
}

// ParseBufferSize reads KFD_MAX_BUFFER_SIZE as the plugin does: a decimal (or 0x hex)
// byte count with an optional K/k, M or G suffix (powers of 1024); 0 means no limit.
// Unlike the plugin, which logs and ignores a bad value, it returns an error.
func ParseBufferSize(s string) (uint64, error) {
	num, shift := s, uint(0)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K', 'k':
			num, shift = s[:n-1], 10
		case 'M':
			num, shift = s[:n-1], 20
		case 'G':
			num, shift = s[:n-1], 30
		}
	}
	base := 10
	if rest, ok := strings.CutPrefix(num, "0x"); ok {
		num, base = rest, 16
	} else if rest, ok := strings.CutPrefix(num, "0X"); ok {
		num, base = rest, 16
	}
	v, err := strconv.ParseUint(num, base, 64)
	if err != nil {
		return 0, fmt.Errorf("KFD_MAX_BUFFER_SIZE=%q: want a byte count such as 0 (no limit), 1073741824, 1024K, 512M or 2G", s)
	}
	if v > ^uint64(0)>>shift {
		return 0, fmt.Errorf("KFD_MAX_BUFFER_SIZE=%q: larger than 2^64 bytes", s)
	}
	return v << shift, nil
}
