// Package plugin connects gpucr to CRIU's amdgpu plugin, which saves and restores /dev/kfd
// state inside CRIU's own dump and restore: gpucr finds the plugin, says when a tree or an
// image needs it, and checks before a restore that this host's GPUs can take the image's.
package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpucr/gpucr/internal/amd"
	"github.com/gpucr/gpucr/internal/amd/amdimg"
	"github.com/gpucr/gpucr/internal/amd/kfd"
	"github.com/gpucr/gpucr/internal/proctree"
)

// FileName is the plugin's shared object; CRIU loads every plugin in the directory that
// CRIU_LIBS_DIR names.
const FileName = "amdgpu_plugin.so"

// ErrMissing means a tree or image needs the plugin and it is not installed.
var ErrMissing = errors.New("CRIU's amdgpu plugin is not installed (run scripts/install-deps.sh)")

// Find returns the directory holding the plugin for the CRIU at criuPath: the install
// script puts it in PREFIX/lib/amdgpu beside PREFIX/sbin/criu; a system CRIU keeps it in
// /usr/lib/criu. It returns "" when there is none. gpucr keeps the plugin out of CRIU's
// default directory so CRIU loads it only for AMD work.
func Find(criuPath string) string {
	for _, dir := range []string{filepath.Join(filepath.Dir(filepath.Dir(criuPath)), "lib", "amdgpu"), "/usr/lib/criu"} {
		if _, err := os.Stat(filepath.Join(dir, FileName)); err == nil {
			return dir
		}
	}
	return ""
}

// UsesKFD returns the first of pids that has /dev/kfd open, or 0.
func UsesKFD(pids []int) int {
	for _, pid := range pids {
		if files, err := proctree.OpenFiles("/proc", pid); err == nil && slices.Contains(files, "/dev/kfd") {
			return pid
		}
	}
	return 0
}

// KFDImages lists the plugin's process images in a CRIU image directory.
func KFDImages(criuDir string) ([]string, error) {
	return filepath.Glob(filepath.Join(criuDir, strings.Replace(amdimg.KFDFilePattern, "%d", "*", 1)))
}

// CheckRestore maps the GPUs of every process image in criuDir onto the GPUs of the host
// topology under topologyRoot, with the checks that skips leave on. It returns each
// image's mapping (image gpu_id -> host gpu_id), or why the host cannot take the image.
func CheckRestore(criuDir, topologyRoot string, skips amd.Skips) (map[string]map[uint32]uint32, error) {
	imgs, err := KFDImages(criuDir)
	if err != nil || len(imgs) == 0 {
		return nil, err
	}
	nodes, err := kfd.Read(topologyRoot)
	if err != nil {
		return nil, fmt.Errorf("the image holds AMD GPU state, and this host's KFD topology cannot be read: %w", err)
	}
	kfd.SetNUMANodes(nodes)
	host := kfd.GPUs(nodes)
	out := map[string]map[uint32]uint32{}
	for _, path := range imgs {
		var k amdimg.CriuKfd
		if err := amdimg.Read(path, &k); err != nil {
			return nil, err
		}
		image := amdimg.Nodes(&k)
		kfd.SetNUMANodes(image)
		m, err := amd.Map(kfd.GPUs(image), host, skips)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
		}
		out[filepath.Base(path)] = m
	}
	return out, nil
}

// Env returns the plugin's environment settings for the checks that skips switch off.
func Env(skips amd.Skips) []string {
	var env []string
	for _, c := range amd.Checks() {
		if skips[c.Name] {
			env = append(env, c.Env+"=0")
		}
	}
	return env
}
