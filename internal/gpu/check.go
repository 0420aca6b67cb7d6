package gpu

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Check is one restore compatibility check of a backend. Like the KFD_*_CHECK switches of
// AMD's CRIU plugin, each is on by default: a user who knows better switches it off by
// name (--skip-check) or by setting Env to 0. A check with no Env cannot be switched off.
type Check struct {
	Name string
	Env  string
	Doc  string
}

// Skips holds the checks switched off: backend name -> check name.
type Skips map[string]map[string]bool

// For returns the checks of backend switched off; never nil.
func (s Skips) For(backend string) map[string]bool {
	if s[backend] == nil {
		return map[string]bool{}
	}
	return s[backend]
}

// SkipsFrom collects the checks of vendors switched off by --skip-check names (a name
// switches off the check of that name of every vendor that has one) and by their
// environment variables, read through getenv (os.Getenv outside tests). A variable takes
// 0 or no to switch its check off, 1 or yes (or nothing) to keep it on; anything else is
// an error rather than a check silently left on by a typo.
func SkipsFrom(vendors []Vendor, names []string, getenv func(string) string) (Skips, error) {
	s := Skips{}
	off := func(vendor, check string) {
		if s[vendor] == nil {
			s[vendor] = map[string]bool{}
		}
		s[vendor][check] = true
	}
	for _, v := range vendors {
		for _, c := range v.Checks {
			if c.Env == "" {
				continue
			}
			switch val := getenv(c.Env); strings.ToLower(val) {
			case "0", "no":
				off(v.Name, c.Name)
			case "", "1", "yes":
			default:
				return nil, fmt.Errorf("%s=%q: want 0 or no to switch the %s check off, 1 or yes to keep it", c.Env, val, c.Name)
			}
		}
	}
	for _, n := range names {
		known := false
		for _, v := range vendors {
			if slices.ContainsFunc(v.Checks, func(c Check) bool { return c.Name == n && c.Env != "" }) {
				off(v.Name, n)
				known = true
			}
		}
		if !known {
			return nil, fmt.Errorf("unknown check %q for --skip-check; the checks are %s", n, strings.Join(CheckNames(vendors), ", "))
		}
	}
	return s, nil
}

// CheckNames lists the names of vendors' switchable checks, each once.
func CheckNames(vendors []Vendor) []string {
	var out []string
	for _, v := range vendors {
		for _, c := range v.Checks {
			if c.Env != "" && !slices.Contains(out, c.Name) {
				out = append(out, c.Name)
			}
		}
	}
	return out
}

// ErrBadGPUMap means the user's --gpu-map cannot be followed: a pair that is not OLD=NEW,
// a GPU the image or this host does not have, two GPUs on one. It is the request's mistake
// (exit 2), as the same map of an image without GPU state is; its text is the flag's name,
// which the errors wrapping it begin with.
var ErrBadGPUMap = errors.New("--gpu-map")

// ErrIncompatible means this host's GPUs cannot take an image's device state; every
// *IncompatibleError matches it with errors.Is.
var ErrIncompatible = errors.New("incompatible GPU")

// IncompatibleError is one failed check, worded so the user sees what differs and, where
// the check can be switched off, how.
type IncompatibleError struct {
	Check    string // the check's name, as --skip-check takes it
	Env      string // the check's environment switch; empty: it cannot be switched off
	Device   string // which GPU(s), e.g. "GPU 0 (GPU-…)", or "driver"
	Property string // what is wrong, e.g. "compute capability differs"
	Image    string // the image's value
	Host     string // this host's value
}

// Incompatible builds the error of check c failing.
func Incompatible(c Check, device, property, image, host string) *IncompatibleError {
	return &IncompatibleError{Check: c.Name, Env: c.Env, Device: device, Property: property, Image: image, Host: host}
}

func (e *IncompatibleError) Error() string {
	how := "this check cannot be switched off"
	if e.Env != "" {
		how = fmt.Sprintf("skip with --skip-check %s or %s=0", e.Check, e.Env)
	}
	return fmt.Sprintf("%s: %s: image %s, host %s (%s)", e.Device, e.Property, e.Image, e.Host, how)
}

// Is makes errors.Is(err, ErrIncompatible) true.
func (e *IncompatibleError) Is(target error) bool { return target == ErrIncompatible }
