package main

import (
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
)

// fold says how plain CRIU restores what it wrote: with gpucr's CRIU plugin where the
// image has processes whose device files only that plugin carries, and without a word of
// GPU state for an image that has none. It said the one line for every image, and plain
// CRIU failed on such an image (hostile test).
func TestFoldSaysHowPlainCRIURestores(t *testing.T) {
	cpu := &image.Manifest{}
	gpuOnly := &image.Manifest{GPUs: []gpu.Snapshot{{Processes: []gpu.Process{{PID: 7}}}}}
	held := &image.Manifest{GPUs: []gpu.Snapshot{{Processes: []gpu.Process{{PID: 7}}, FileHolders: []int{8}}}}
	for _, c := range []struct {
		name string
		m    *image.Manifest
		want string
	}{
		{"CPU only", cpu, "criu restore -D /new/criu restores it"},
		{"GPU state", gpuOnly, "criu restore -D /new/criu restores the CPU side; GPU state still needs gpucr"},
		{"device files", held, "CRIU_LIBS_DIR=<the directory of gpucr's gpucr_nvidia.so> criu restore -D /new/criu restores the CPU side"},
	} {
		if got := plainRestoreHint(c.m, "/new", ""); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: %q, want it to begin %q", c.name, got, c.want)
		}
	}
}
