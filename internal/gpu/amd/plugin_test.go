package amd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/amd/placement"
	"github.com/gpucr/gpucr/internal/proctree"
)

// fixtureImage is a CRIU image directory holding the plugin's image of a process on a
// four-GPU PCIe host (pcie4-numa2).
func fixtureImage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("amdimg", "testdata", "amdgpu-kfd-7.img"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "amdgpu-kfd-7.img"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func topology(name string) string { return filepath.Join("kfd", "testdata", name) }

// The backend plans a restore from the plugin's images: in place on the host the image
// came from, refused onto hosts that cannot take it, with the plugin told which checks
// are off; an image without them is none of its business.
func TestPlanRestore(t *testing.T) {
	ctx := context.Background()
	img := fixtureImage(t)
	skips := gpu.Skips{Name: {placement.CheckFW: true, placement.CheckNUMA: true}}

	plan, err := New(topology("pcie4-numa2"), "/plugins").PlanRestore(ctx, gpu.RestoreInput{CRIUDir: img, Skips: skips})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Remap != nil || !slices.Equal(plan.Env, []string{"KFD_FW_VER_CHECK=0", "KFD_NUMA_CHECK=0"}) {
		t.Errorf("plan = %+v, want the GPUs in place and two checks off", plan)
	}
	for _, host := range []string{"mi210", "xgmi-hive4"} { // one GPU cannot take four; PCIe peers not in an xGMI hive
		if _, err := New(topology(host), "/plugins").PlanRestore(ctx, gpu.RestoreInput{CRIUDir: img}); !errors.Is(err, gpu.ErrIncompatible) {
			t.Errorf("%s: %v, want ErrIncompatible", host, err)
		}
	}
	if _, err := New(topology("pcie4-numa2"), "/plugins").PlanRestore(ctx, gpu.RestoreInput{CRIUDir: img, GPUMap: "0=1"}); err == nil {
		t.Error("--gpu-map was accepted for AMD state")
	}
	if plan, err := New(topology("mi210"), "/plugins").PlanRestore(ctx, gpu.RestoreInput{CRIUDir: t.TempDir()}); plan != nil || err != nil {
		t.Errorf("an image without AMD state: %+v, %v; want nothing", plan, err)
	}
}

// The devices KFD lists are the host's GPUs, named by gpu_id as the plugin's images are.
func TestHostFromTopology(t *testing.T) {
	h, err := New(topology("pcie4-numa2"), "").Host(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range h.Devices {
		ids = append(ids, d.UUID)
	}
	if h.Backend != Name || !slices.Equal(ids, []string{"18346", "29493", "51142", "63541"}) {
		t.Fatalf("Host = %+v", h)
	}
}

// Processes finds what holds /dev/kfd: here, nothing.
func TestProcessesWithoutKFD(t *testing.T) {
	procs, err := New(topology("mi210"), "").Processes(context.Background(), proctree.Snap("/proc", []proctree.Process{{PID: os.Getpid()}}))
	if err != nil || len(procs) != 0 {
		t.Fatalf("Processes = %v, %v", procs, err)
	}
}
