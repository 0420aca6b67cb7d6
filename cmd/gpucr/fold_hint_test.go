package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/nvidia"
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
		if got := plainRestoreHint(c.m, "/new", "/nonexistent/sbin/criu"); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: %q, want it to begin %q", c.name, got, c.want)
		}
	}
}

// The plugin fold names is the one beside the CRIU gpucr runs, found as gpucr finds it: a
// CRIU named by --criu without its directory (or not named at all, the default) had fold
// look for the plugin relative to the working directory, and name none.
func TestFoldNamesThePluginBesideTheCRIUFound(t *testing.T) {
	prefix := t.TempDir()
	for _, f := range []string{filepath.Join("sbin", "criu"), filepath.Join("lib", "nvidia", nvidia.FilePluginFile)} {
		if err := os.MkdirAll(filepath.Join(prefix, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(prefix, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", filepath.Join(prefix, "sbin"))
	held := &image.Manifest{GPUs: []gpu.Snapshot{{FileHolders: []int{8}}}}
	want := "CRIU_LIBS_DIR=" + filepath.Join(prefix, "lib", "nvidia") + " criu restore -D /new/criu restores it"
	if got := plainRestoreHint(held, "/new", "criu"); got != want {
		t.Errorf("--criu criu: %q, want %q", got, want)
	}
}
