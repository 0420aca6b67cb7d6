package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Vendor is what a backend package registers from its init: enough for the pipeline to
// know the vendor without naming it — its checks and settings for the command line, the
// device files its processes hold, and how to open its backend on this host.
type Vendor struct {
	Name string
	// DeviceFiles are glob patterns of the device files a process using this vendor's
	// GPUs holds open: a tree holding one is refused when the backend is off here.
	DeviceFiles []string
	// ImageFiles are glob patterns of the files its CRIU plugin adds to CRIU's images: an
	// image holding one is refused when the backend is off here.
	ImageFiles []string
	Checks     []Check
	// Settings are the environment variables the backend reads; the command line reads
	// them once into Config.Settings.
	Settings []string
	// Note is said wherever the vendor shows (what has not been tested, say); may be empty.
	Note string
	// Open opens the backend with cfg, or says why it cannot work on this host.
	Open func(cfg Config) (Backend, error)
	// Describe, when set, summarizes the vendor's state in an image's CRIU files for
	// gpucr inspect; nil when they hold none.
	Describe func(criuDir string) (*Description, error)
}

// Description is a vendor's summary of its state in an image: Data for JSON, Lines for people.
type Description struct {
	Data  any
	Lines []string
}

// Config is what backends are opened with: where CRIU is (a plugin lives beside it) and
// the vendors' settings, read once by the command line.
type Config struct {
	CRIU     string
	Settings map[string]string
}

// PluginDir returns the first of dirs that holds the CRIU plugin file, or "". A dir that
// is relative names one of PREFIX/lib beside the CRIU at criuPath (PREFIX/sbin/criu, as
// the install script puts gpucr's plugins there, out of CRIU's default directory); without
// a criuPath it is passed over.
func PluginDir(criuPath, file string, dirs ...string) string {
	for _, dir := range dirs {
		if !filepath.IsAbs(dir) {
			if criuPath == "" {
				continue
			}
			dir = filepath.Join(filepath.Dir(filepath.Dir(criuPath)), "lib", dir)
		}
		if _, err := os.Stat(filepath.Join(dir, file)); err == nil {
			return dir
		}
	}
	return ""
}

// Off is a registered vendor whose backend cannot work on this host, and why.
type Off struct {
	Vendor
	Reason error
}

var (
	mu      sync.Mutex
	vendors []Vendor
)

// Register makes a vendor known; backend packages call it from init.
func Register(v Vendor) {
	mu.Lock()
	defer mu.Unlock()
	vendors = append(vendors, v)
	slices.SortFunc(vendors, func(a, b Vendor) int { return strings.Compare(a.Name, b.Name) })
}

// Vendors lists the registered vendors by name.
func Vendors() []Vendor {
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(vendors)
}

// Named returns the backend of backends called name, or nil.
func Named(backends []Backend, name string) Backend {
	for _, b := range backends {
		if b.Name() == name {
			return b
		}
	}
	return nil
}

// Probe opens every registered backend with cfg. It returns those that work here and the
// vendors that do not, with the reason, so callers can say why GPU support is off.
func Probe(cfg Config) (ready []Backend, off []Off) {
	for _, v := range Vendors() {
		b, err := v.Open(cfg)
		if err != nil {
			off = append(off, Off{Vendor: v, Reason: err})
			continue
		}
		ready = append(ready, b)
	}
	return ready, off
}

// Holds reports whether file is one of the vendor's device files.
func (v Vendor) Holds(file string) bool {
	for _, p := range v.DeviceFiles {
		if ok, _ := filepath.Match(p, file); ok {
			return true
		}
	}
	return false
}

// Refusal says that a process uses the GPUs of a vendor whose backend is off here.
func (o Off) Refusal(pid int, file string) error {
	return fmt.Errorf("process %d holds %s, and the %s GPU backend is off on this host: %v (see gpucr check)", pid, file, o.Name, o.Reason)
}
