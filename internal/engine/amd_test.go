package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/amd"
	"github.com/gpucr/gpucr/internal/amd/plugin"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/testutil"
)

// There is no AMD GPU here: these tests restore a real CRIU image that carries the amdgpu
// plugin's image of a process on a four-GPU PCIe host (a fixture), onto fixture topologies.

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
	b, err := os.ReadFile(filepath.Join("..", "amd", "amdimg", "testdata", "amdgpu-kfd-7.img"))
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
	return filepath.Join("..", "amd", "kfd", "testdata", name)
}

func TestAMDImageIsCheckedBeforeRestore(t *testing.T) {
	e := newEngine(t, &fakeGPU{})
	e.AMDPluginDir = plugin.Find(e.CRIU.Path)
	if e.AMDPluginDir == "" {
		testutil.SkipOrFail(t, "CRIU's amdgpu plugin is not installed (make deps)")
	}
	dir := amdImage(t, e)

	e.KFDTopology = topology("mi210") // one GPU cannot take four
	_, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir})
	if !errors.Is(err, amd.ErrIncompatible) {
		t.Fatalf("restore of a 4-GPU image on a 1-GPU host: %v, want ErrIncompatible", err)
	}

	e.KFDTopology = topology("xgmi-hive4") // PCIe peers must not land in an xGMI hive
	if _, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir}); !errors.Is(err, amd.ErrIncompatible) {
		t.Fatalf("restore of PCIe GPUs onto an xGMI hive: %v, want ErrIncompatible", err)
	}

	e.AMDPluginDir = ""
	e.KFDTopology = topology("pcie4-numa2")
	if _, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir}); !errors.Is(err, plugin.ErrMissing) {
		t.Fatalf("restore without the plugin: %v, want ErrMissing", err)
	}
}

func TestAMDSkipsReachThePlugin(t *testing.T) {
	if got := plugin.Env(amd.Skips{amd.CheckFW: true, amd.CheckNUMA: true}); len(got) != 2 ||
		got[0] != "KFD_FW_VER_CHECK=0" || got[1] != "KFD_NUMA_CHECK=0" {
		t.Fatalf("plugin.Env = %v", got)
	}
}

func TestAMDImageRestoresThroughThePlugin(t *testing.T) {
	e := newEngine(t, &fakeGPU{})
	e.AMDPluginDir = plugin.Find(e.CRIU.Path)
	if e.AMDPluginDir == "" {
		testutil.SkipOrFail(t, "CRIU's amdgpu plugin is not installed (make deps)")
	}
	dir := amdImage(t, e)
	e.KFDTopology = topology("pcie4-numa2") // the host the image was taken on
	res, err := e.Restore(context.Background(), e.TreeImage(), RestoreRequest{Dir: dir, AMDSkips: amd.Skips{amd.CheckFW: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(res.RootPID, syscall.SIGKILL) })
	if m := res.AMDMap["amdgpu-kfd-7.img"]; len(m) != 4 || m[18346] != 18346 {
		t.Errorf("AMD map = %v, want the four GPUs in place", res.AMDMap)
	}
}
