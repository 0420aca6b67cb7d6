package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/amd"
	"github.com/gpucr/gpucr/internal/gpu/amd/placement"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/testutil"
)

// There is no AMD GPU here: these tests restore a real CRIU image that carries the amdgpu
// plugin's image of a process on a four-GPU PCIe host (a fixture), onto fixture topologies,
// through the engine's vendor-neutral path: the AMD backend is one gpu.CRIUPlugin among
// the engine's backends.

func amdImage(t *testing.T, e *Engine) string {
	t.Helper()
	pid := testutil.StartSleeper(t).Process.Pid
	dir := filepath.Join(t.TempDir(), "img")
	if _, err := e.Checkpoint(context.Background(), e.Tree(pid), CheckpointRequest{Dir: dir, LockTimeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil { // CRIU killed it: free its PID
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("..", "gpu", "amd", "amdimg", "testdata", "amdgpu-kfd-7.img"))
	if err != nil {
		t.Fatal(err)
	}
	return imagetest.Recommit(t, dir, func(staged string) {
		if err := os.WriteFile(filepath.Join(staged, image.CRIUDir, "amdgpu-kfd-7.img"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	})
}

func topology(name string) string {
	return filepath.Join("..", "gpu", "amd", "kfd", "testdata", name)
}

// amdEngine is an engine whose AMD backend sees the fixture topology name.
func amdEngine(t *testing.T, name string) (*Engine, string) {
	e := newEngine(t, &fakeGPU{})
	dir := amd.FindPlugin(e.CRIU.Path)
	if dir == "" {
		testutil.SkipOrFail(t, "CRIU's amdgpu plugin is not installed (make deps)")
	}
	e.Backends = append(e.Backends, amd.New(topology(name), dir))
	return e, dir
}

func TestAMDImageIsCheckedBeforeRestore(t *testing.T) {
	e, _ := amdEngine(t, "mi210") // one GPU cannot take four
	dir := amdImage(t, e)
	_, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir})
	if !errors.Is(err, gpu.ErrIncompatible) {
		t.Fatalf("restore of a 4-GPU image on a 1-GPU host: %v, want ErrIncompatible", err)
	}

	e.Backends[1] = amd.New(topology("xgmi-hive4"), "/plugins") // PCIe peers must not land in an xGMI hive
	if _, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir}); !errors.Is(err, gpu.ErrIncompatible) {
		t.Fatalf("restore of PCIe GPUs onto an xGMI hive: %v, want ErrIncompatible", err)
	}

	// Off here (no plugin): the image's plugin files name the vendor and the reason.
	e.Backends = e.Backends[:1]
	e.Off = []gpu.Off{{Vendor: gpu.Vendor{Name: amd.Name, ImageFiles: []string{"amdgpu-kfd-*.img"}}, Reason: amd.ErrMissing}}
	if _, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir}); !errors.Is(err, ErrNoBackend) || !strings.Contains(err.Error(), amd.ErrMissing.Error()) {
		t.Fatalf("restore without the plugin: %v, want ErrNoBackend naming the missing plugin", err)
	}
}

func TestAMDImageRestoresThroughThePlugin(t *testing.T) {
	e, _ := amdEngine(t, "pcie4-numa2") // the host the image was taken on
	dir := amdImage(t, e)
	skips := gpu.Skips{amd.Name: {placement.CheckFW: true}}
	res, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir, Skips: skips})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(res.RootPID, syscall.SIGKILL) })
	if res.GPUMap[amd.Name] != nil {
		t.Errorf("GPU map = %v, want the four AMD GPUs in place", res.GPUMap)
	}
}

// noFilePlugin is a restore target that loads device-state plugins but not the one that
// opens device files again.
type noFilePlugin struct{ RestoreTarget }

func (noFilePlugin) FilePlugins() bool { return false }

// An image whose plugin restores device state alone restores on a target that loads such
// plugins, whatever it says of the plugin for device files: every plugin image was refused
// there (review).
func TestDeviceStatePluginNeedsNoFilePlugin(t *testing.T) {
	e, _ := amdEngine(t, "pcie4-numa2")
	dir := amdImage(t, e)
	skips := gpu.Skips{amd.Name: {placement.CheckFW: true}}
	res, err := e.Restore(context.Background(), noFilePlugin{e.TreeImage()}, RestoreRequest{Dir: dir, Skips: skips})
	if err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(res.RootPID, syscall.SIGKILL)
}
