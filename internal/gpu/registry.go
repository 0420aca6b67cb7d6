package gpu

import (
	"sort"
	"sync"
)

// Config says where the backends find their driver libraries, for a driver off the
// loader's path or a fake one in tests; an empty field means the loader's default.
type Config struct {
	LibCUDA string // NVIDIA's libcuda.so.1
	LibNVML string // NVIDIA's libnvidia-ml.so.1
}

// Opener opens a backend with cfg, or returns why it cannot work on this host (no
// driver, say).
type Opener func(cfg Config) (Backend, error)

var (
	mu      sync.Mutex
	openers = map[string]Opener{}
)

// Register makes a backend known; backends call it from init.
func Register(name string, open Opener) {
	mu.Lock()
	defer mu.Unlock()
	openers[name] = open
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

// Probe opens every registered backend with cfg. It returns those that work here and, for
// each one that does not, the reason, so callers can say why GPU support is off.
func Probe(cfg Config) (ready []Backend, unavailable map[string]error) {
	mu.Lock()
	names := make([]string, 0, len(openers))
	for n := range openers {
		names = append(names, n)
	}
	mu.Unlock()
	sort.Strings(names)
	unavailable = map[string]error{}
	for _, n := range names {
		mu.Lock()
		open := openers[n]
		mu.Unlock()
		b, err := open(cfg)
		if err != nil {
			unavailable[n] = err
			continue
		}
		ready = append(ready, b)
	}
	return ready, unavailable
}
