// Package amd is the AMD GPU backend. CRIU's amdgpu plugin saves and restores /dev/kfd
// state within CRIU's own dump and restore: the backend finds the plugin and the
// processes that need it, and plans a restore with the plugin's own checks (placement).
package amd

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/amd/amdimg"
	"github.com/gpucr/gpucr/internal/gpu/amd/kfd"
	"github.com/gpucr/gpucr/internal/gpu/amd/placement"
	"github.com/gpucr/gpucr/internal/proctree"
)

// Name is the backend's name in images and on the command line.
const Name = "amd"

// SettingBufferSize is the plugin's own setting: the largest buffer it stages at once.
const SettingBufferSize = "KFD_MAX_BUFFER_SIZE"

// PluginFile is the plugin's shared object; CRIU loads every plugin in the directory that
// CRIU_LIBS_DIR names.
const PluginFile = "amdgpu_plugin.so"

// ErrMissing means a tree or image needs the plugin and it is not installed.
var ErrMissing = errors.New("CRIU's amdgpu plugin is not installed (run scripts/install-deps.sh)")

// untested is said wherever AMD support shows: it is built and tested on fixtures only.
const untested = "gpucr's AMD support has not been run on AMD hardware"

func init() {
	gpu.Register(gpu.Vendor{
		Name:        Name,
		DeviceFiles: []string{"/dev/kfd"},
		ImageFiles:  []string{kfdImagePattern},
		Checks:      placement.Checks(),
		Settings:    []string{SettingBufferSize},
		Note:        untested,
		Open:        Open,
		Describe:    describeImage,
	})
}

// Backend is the AMD implementation of gpu.CRIUPlugin.
type Backend struct {
	topology  string // where the KFD topology is read (kfd.DefaultRoot outside tests)
	pluginDir string
}

// Open finds KFD's GPUs and CRIU's amdgpu plugin beside the CRIU of cfg, or says in one
// line why AMD GPU support is off here.
func Open(cfg gpu.Config) (gpu.Backend, error) {
	if v := cfg.Settings[SettingBufferSize]; v != "" {
		if _, err := placement.ParseBufferSize(v); err != nil { // the plugin would log and ignore it
			return nil, fmt.Errorf("%w; AMD GPU support is off", err)
		}
	}
	nodes, err := kfd.Read(kfd.DefaultRoot)
	switch {
	case err != nil:
		return nil, fmt.Errorf("no AMD KFD driver (%s unreadable); AMD GPU support is off", kfd.DefaultRoot)
	case len(kfd.GPUs(nodes)) == 0:
		return nil, errors.New("KFD lists no GPUs; AMD GPU support is off")
	}
	dir := FindPlugin(cfg.CRIU)
	if dir == "" {
		return nil, fmt.Errorf("%w; AMD GPU support is off", ErrMissing)
	}
	return New(kfd.DefaultRoot, dir), nil
}

// New is the backend for the KFD topology under topology and the plugin in pluginDir.
func New(topology, pluginDir string) *Backend {
	return &Backend{topology: topology, pluginDir: pluginDir}
}

// FindPlugin returns the directory holding the plugin for the CRIU at criuPath: the
// install script puts it in PREFIX/lib/amdgpu beside PREFIX/sbin/criu; a system CRIU keeps
// it in /usr/lib/criu. It returns "" when there is none. gpucr keeps the plugin out of
// CRIU's default directory so CRIU loads it only for AMD work.
func FindPlugin(criuPath string) string {
	return gpu.PluginDir(criuPath, PluginFile, "amdgpu", "/usr/lib/criu")
}

// Name implements gpu.Backend.
func (b *Backend) Name() string { return Name }

// PluginDir implements gpu.CRIUPlugin.
func (b *Backend) PluginDir() string { return b.pluginDir }

// Host describes KFD's GPUs; a GPU's UUID is its gpu_id, the name the plugin's images use.
func (b *Backend) Host(context.Context) (gpu.Host, error) {
	nodes, err := kfd.Read(b.topology)
	if err != nil {
		return gpu.Host{}, fmt.Errorf("read the KFD topology: %w", err)
	}
	kfd.SetNUMANodes(nodes)
	h := gpu.Host{Backend: Name}
	for i, n := range kfd.GPUs(nodes) {
		h.Devices = append(h.Devices, gpu.Device{
			Index: i, UUID: strconv.FormatUint(uint64(n.GPUID), 10), Name: n.Name, MemoryTotal: n.LocalMemSize, NUMANode: n.NUMANode,
			Properties: gpu.Properties{"model": placement.Model(n), "fwVersion": strconv.FormatUint(uint64(n.FWVersion), 10)},
		})
	}
	return h, nil
}

// Processes returns the processes of tree with /dev/kfd open. Which GPUs each uses shows
// only in the plugin's images, so Devices stays empty.
func (b *Backend) Processes(_ context.Context, tree *proctree.Snapshot) ([]gpu.Process, error) {
	var out []gpu.Process
	for _, pid := range tree.PIDs() {
		files, err := tree.Files(pid)
		if err != nil {
			continue // gone: it holds nothing
		}
		if slices.Contains(files, "/dev/kfd") {
			out = append(out, gpu.Process{PID: pid})
		}
	}
	return out, nil
}

// PlanRestore maps the GPUs of each of the plugin's process images onto this host's, with
// the checks in.Skips leaves on, and passes the plugin the switches of those it turns off.
// The mapping is the plugin's own (by topology), so --gpu-map does not apply.
func (b *Backend) PlanRestore(_ context.Context, in gpu.RestoreInput) (*gpu.Plan, error) {
	imgs, err := kfdImages(in.CRIUDir)
	if err != nil || len(imgs) == 0 {
		return nil, err
	}
	if strings.TrimSpace(in.GPUMap) != "" {
		return nil, fmt.Errorf("%w does not apply to AMD GPU state: CRIU's amdgpu plugin places GPUs by topology", gpu.ErrBadGPUMap)
	}
	skips := placement.Skips(in.Skips.For(Name))
	maps, err := checkRestore(imgs, b.topology, skips)
	if err != nil {
		return nil, err
	}
	plan := &gpu.Plan{}
	for img, m := range maps {
		for from, to := range m {
			if from != to {
				if plan.Remap == nil {
					plan.Remap = map[string]string{}
				}
				plan.Remap[fmt.Sprintf("%s:%d", img, from)] = strconv.FormatUint(uint64(to), 10)
			}
		}
	}
	for _, c := range placement.Checks() {
		if c.Env != "" && skips[c.Name] {
			plan.Env = append(plan.Env, c.Env+"=0")
		}
	}
	return plan, nil
}

// kfdImagePattern matches the plugin's process images in a CRIU image directory.
var kfdImagePattern = strings.Replace(amdimg.KFDFilePattern, "%d", "*", 1)

func kfdImages(criuDir string) ([]string, error) {
	return filepath.Glob(filepath.Join(criuDir, kfdImagePattern))
}

// checkRestore maps the GPUs of every process image onto the GPUs of the host topology
// under topologyRoot. It returns each image's mapping (image gpu_id -> host gpu_id), or
// why the host cannot take the image.
func checkRestore(imgs []string, topologyRoot string, skips placement.Skips) (map[string]map[uint32]uint32, error) {
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
		m, err := placement.Map(kfd.GPUs(image), host, skips)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
		}
		out[filepath.Base(path)] = m
	}
	return out, nil
}

// describeImage summarizes the plugin's images in criuDir for gpucr inspect.
func describeImage(criuDir string) (*gpu.Description, error) {
	s, err := amdimg.Summarize(criuDir)
	if err != nil || len(s.Processes) == 0 {
		return nil, err
	}
	d := &gpu.Description{Data: s, Lines: []string{"(" + untested + ")"}}
	for _, p := range s.Processes {
		line := fmt.Sprintf("pid %d (%s): GPUs", p.PID, p.File)
		for _, g := range p.GPUs {
			line += fmt.Sprintf(" %d", g.GPUID)
		}
		d.Lines = append(d.Lines, line)
		for _, b := range p.Buffers {
			d.Lines = append(d.Lines, fmt.Sprintf("  gpu %d %-10s %d x %s = %s", b.GPUID, b.Domain, b.Count, humanize.IBytes(b.Size), humanize.IBytes(b.Bytes)))
		}
	}
	return d, nil
}
