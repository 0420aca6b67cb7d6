package nvidia

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/gpu"
)

// twoGPUs is a host of two mock H100s, A (minor 0) and B (minor 1), found by UUID too.
func twoGPUs() *mock.Interface {
	a, b := mockH100(uuidA, "00000000:1A:00.0"), mockH100(uuidB, "00000000:9A:00.0")
	a.GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	b.GetMinorNumberFunc = func() (int, nvml.Return) { return 1, nvml.SUCCESS }
	lib := mockNVML(a, b)
	lib.DeviceGetHandleByUUIDFunc = func(u string) (nvml.Device, nvml.Return) {
		switch u {
		case uuidA:
			return a, nvml.SUCCESS
		case uuidB:
			return b, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	return lib
}

// containerRoot is a root whose /dev holds the given nodes: name -> char minor of the
// driver's major (-1: a regular file of that name).
func containerRoot(t *testing.T, nodes map[string]int) string {
	t.Helper()
	root := t.TempDir()
	dev := filepath.Join(root, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, minor := range nodes {
		p := filepath.Join(dev, name)
		if minor < 0 {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(deviceMajor, uint32(minor)))); err != nil {
			t.Skipf("mknod %s: %v (device nodes need CAP_MKNOD)", p, err)
		}
	}
	return root
}

// A container given GPU B restores an image of GPU A onto B; one given A keeps it on A;
// a file merely named like a GPU node, and nvidiactl, give no GPU.
func TestPlanRestoreOntoTheContainersGPUs(t *testing.T) {
	img := image([]string{uuidA}, h100(0, uuidA, 0))
	cases := []struct {
		name  string
		nodes map[string]int
		want  map[string]string
		err   string
	}{
		{"given B", map[string]int{"nvidia1": 1, "nvidiactl": 255}, map[string]string{uuidA: uuidB}, ""},
		{"given A", map[string]int{"nvidia0": 0, "nvidiactl": 255}, nil, ""},
		{"given both", map[string]int{"nvidia0": 0, "nvidia1": 1}, nil, ""},
		{"a file named nvidia0", map[string]int{"nvidia0": -1, "nvidiactl": 255}, nil, "can reach none of this host's 2 NVIDIA GPUs"},
		{"no GPU node", map[string]int{"null": -1}, nil, "can reach none"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBackend(twoGPUs(), &fakeDriver{})
			plan, err := b.PlanRestore(context.Background(), gpu.RestoreInput{Snapshot: &img, Root: containerRoot(t, c.nodes)})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(plan.Remap) != len(c.want) || plan.Remap[uuidA] != c.want[uuidA] {
				t.Fatalf("remap = %v, want %v", plan.Remap, c.want)
			}
		})
	}
}

// A GPU whose minor number NVML cannot give is not ruled out: nothing tells whether the
// container has it.
func TestPlanRestoreKeepsAGPUWithoutMinorNumber(t *testing.T) {
	lib := twoGPUs()
	b0, _ := lib.DeviceGetHandleByUUID(uuidA)
	b0.(*mock.Device).GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	img := image([]string{uuidA}, h100(0, uuidA, 0))
	plan, err := newBackend(lib, &fakeDriver{}).PlanRestore(context.Background(),
		gpu.RestoreInput{Snapshot: &img, Root: containerRoot(t, map[string]int{"nvidia1": 1})})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Remap) != 0 {
		t.Fatalf("remap = %v, want the image's GPU kept", plan.Remap)
	}
}

// Without a root (a process tree restored on the host) every GPU is a candidate and the
// image's GPU stays where it was, as before.
func TestPlanRestoreWithoutRootUsesEveryGPU(t *testing.T) {
	img := image([]string{uuidB}, h100(1, uuidB, 0))
	plan, err := newBackend(twoGPUs(), &fakeDriver{}).PlanRestore(context.Background(), gpu.RestoreInput{Snapshot: &img})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Remap) != 0 {
		t.Fatalf("remap = %v, want none", plan.Remap)
	}
}

// A symlink in the container's /dev to a GPU node of the host is no GPU the container was
// given (a hostile test restored GPU state onto a GPU so).
func TestPlanRestoreCountsNoSymlinkedNode(t *testing.T) {
	host := containerRoot(t, map[string]int{"nvidia1": 1})
	root := containerRoot(t, map[string]int{"nvidiactl": 255})
	if err := os.Symlink(filepath.Join(host, "dev", "nvidia1"), filepath.Join(root, "dev", "nvidia1")); err != nil {
		t.Fatal(err)
	}
	img := image([]string{uuidA}, h100(0, uuidA, 0))
	_, err := newBackend(twoGPUs(), &fakeDriver{}).PlanRestore(context.Background(), gpu.RestoreInput{Snapshot: &img, Root: root})
	if err == nil || !strings.Contains(err.Error(), "can reach none of this host's 2 NVIDIA GPUs") {
		t.Fatalf("err = %v, want the container found to reach no GPU", err)
	}
}

// A container whose /dev itself is a symlink (its init chrooted into a directory whose dev
// links to /dev) is refused: read from the host, the link names the host's /dev and every
// GPU in it (a hostile test had its state planned onto the host's GPU so).
func TestPlanRestoreRefusesASymlinkedDev(t *testing.T) {
	host := containerRoot(t, map[string]int{"nvidia1": 1})
	root := t.TempDir()
	if err := os.Symlink(filepath.Join(host, "dev"), filepath.Join(root, "dev")); err != nil {
		t.Fatal(err)
	}
	img := image([]string{uuidA}, h100(0, uuidA, 0))
	plan, err := newBackend(twoGPUs(), &fakeDriver{}).PlanRestore(context.Background(), gpu.RestoreInput{Snapshot: &img, Root: root})
	if err == nil || !strings.Contains(err.Error(), "a symlink is refused") {
		t.Fatalf("PlanRestore = %+v, %v; want the symlinked /dev refused", plan, err)
	}
}

// An image GPU whose UUID is not in NVML's form cannot be given to the driver: the plan
// refuses it, before anything is restored, rather than the driver's restore after CRIU's.
func TestPlanRestoreRefusesAMoveTheDriverCannotTake(t *testing.T) {
	bad := "GPU-../../etc/passwd"
	img := image([]string{bad}, h100(0, bad, 0))
	plan, err := newBackend(twoGPUs(), &fakeDriver{}).PlanRestore(context.Background(), gpu.RestoreInput{Snapshot: &img})
	if err == nil || !strings.Contains(err.Error(), `bad GPU UUID "GPU-../../etc/passwd"`) {
		t.Fatalf("PlanRestore = %+v, %v; want the image's UUID refused", plan, err)
	}
}
