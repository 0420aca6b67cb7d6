// Package amd decides whether and where an AMD GPU checkpoint can be restored on this
// host, with the same checks and switches as AMD's CRIU plugin (criu-amdgpu-plugin(1)),
// so users of that plugin keep their muscle memory.
package amd

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpucr/gpucr/internal/amd/kfd"
)

// Check is one restore check: on by default, off when its Env variable is 0 (or "no", as
// the plugin also accepts) or its Name is in the skip list.
type Check struct {
	Name string
	Env  string
	Doc  string
}

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

var checks = []Check{
	{CheckFW, "KFD_FW_VER_CHECK", "each GPU's firmware version is at least its image GPU's"},
	{CheckSDMAFW, "KFD_SDMA_FW_VER_CHECK", "each GPU's SDMA firmware version is at least its image GPU's"},
	{CheckCaches, "KFD_CACHES_COUNT_CHECK", "each GPU has at least as many caches as its image GPU"},
	{CheckGWS, "KFD_NUM_GWS_CHECK", "each GPU has at least as many global wave syncs (num_gws) as its image GPU"},
	{CheckVRAM, "KFD_VRAM_SIZE_CHECK", "each GPU has at least as much VRAM as its image GPU"},
	{CheckNUMA, "KFD_NUMA_CHECK", "GPUs that shared a CPU NUMA region still do, and GPUs that did not still do not"},
	{CheckCapability, "KFD_CAPABILITY_CHECK", "each GPU's capability bits equal its image GPU's"},
}

// Checks lists the switchable checks in the order they run.
func Checks() []Check { return slices.Clone(checks) }

// Skips holds the names of the checks switched off.
type Skips map[string]bool

// SkipsFrom collects the checks switched off by name (names) and by their environment
// variables (read through getenv, os.Getenv outside tests). Like the plugin, a variable
// takes 0/no to switch off and 1/yes to keep on; anything else is an error here rather
// than a logged warning, so a typo cannot silently leave a check on.
func SkipsFrom(names []string, getenv func(string) string) (Skips, error) {
	s := Skips{}
	for _, c := range checks {
		switch v := getenv(c.Env); strings.ToLower(v) {
		case "0", "no":
			s[c.Name] = true
		case "", "1", "yes":
		default:
			return nil, fmt.Errorf("%s=%q: want 0 or no to switch the %s check off, 1 or yes to keep it", c.Env, v, c.Name)
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(checks, func(c Check) bool { return c.Name == n }) {
			all := make([]string, len(checks))
			for i, c := range checks {
				all[i] = c.Name
			}
			return nil, fmt.Errorf("unknown AMD restore check %q; the checks are %s", n, strings.Join(all, ", "))
		}
		s[n] = true
	}
	return s, nil
}

// ErrIncompatible means this host's GPUs cannot take an image's GPU state; every failed
// check matches it with errors.Is.
var ErrIncompatible = errors.New("incompatible AMD GPU")

// IncompatibleError is one failed check, worded so the user sees what differs and, where
// the check has one, the switch that turns it off.
type IncompatibleError struct {
	Check    string // the check's name
	Env      string // its environment switch; empty for checks that cannot be switched off
	Device   string // which GPUs, by gpu_id
	Property string // what is compared, e.g. "fw_version (host must be >= image)"
	Image    string
	Host     string
}

func (e *IncompatibleError) Error() string {
	how := "this check cannot be switched off"
	if e.Env != "" {
		how = fmt.Sprintf("switch off with %s=0 or skip %s", e.Env, e.Check)
	}
	return fmt.Sprintf("%s: %s: image %s, host %s (%s)", e.Device, e.Property, e.Image, e.Host, how)
}

// Is makes errors.Is(err, ErrIncompatible) true.
func (e *IncompatibleError) Is(target error) bool { return target == ErrIncompatible }

func incompatible(check, device, property, image, host string) *IncompatibleError {
	env := ""
	if i := slices.IndexFunc(checks, func(c Check) bool { return c.Name == check }); i >= 0 {
		env = checks[i].Env
	}
	return &IncompatibleError{Check: check, Env: env, Device: device, Property: property, Image: image, Host: host}
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
	if m, h := model(img), model(host); m != h {
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

func model(n kfd.Node) string {
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
