package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gpucr/gpucr/internal/criu"
)

// fakeDriver is the fake NVIDIA driver (fakenvml.c and fakecuda.c, the one hardware edge
// CI cannot reach): the binary finds as GPU processes the PIDs with a state file in dir,
// and keeps their checkpoint states there, where they outlive a killed gpucr as the
// driver's do. The real driver's path is proven on the device (docs/device-runs/).
type fakeDriver struct {
	dir string
	env []string
}

// fakeLibs builds the fake driver's libraries once, beside the binary under test, and
// returns the environment that points gpucr at them.
var fakeLibs = sync.OnceValues(func() ([]string, error) {
	libs := filepath.Dir(bin.gpucr)
	build := map[string]string{
		"libfakecuda.so": "../../internal/gpu/nvidia/cuda/testdata/fakecuda.c",
		"libfakenvml.so": "../../internal/gpu/nvidia/testdata/fakenvml.c",
	}
	for lib, src := range build {
		if out, err := exec.Command("cc", "-shared", "-fPIC", "-o", filepath.Join(libs, lib), src).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %v\n%s", lib, err, out)
		}
	}
	return []string{"GPUCR_LIBCUDA=" + filepath.Join(libs, "libfakecuda.so"), "GPUCR_LIBNVML=" + filepath.Join(libs, "libfakenvml.so")}, nil
})

// newFakeDriver is a fake driver of its own for the test: no GPU process yet.
func newFakeDriver(t *testing.T) *fakeDriver {
	t.Helper()
	env, err := fakeLibs()
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDriver{dir: t.TempDir()}
	d.env = append(append([]string(nil), env...), "FAKEGPU_DIR="+d.dir)
	return d
}

// claim makes pid a running GPU process.
func (d *fakeDriver) claim(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(d.dir, strconv.Itoa(pid)), []byte("0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// state is pid's checkpoint state: 0 running, 1 locked, 2 checkpointed.
func (d *fakeDriver) state(pid int) string {
	b, err := os.ReadFile(filepath.Join(d.dir, strconv.Itoa(pid)))
	if err != nil {
		return "0"
	}
	return strings.TrimSpace(string(b))
}

// gpucr check says when processes forked after the GPU was in use (DataLoader workers)
// cannot be checkpointed for want of gpucr's CRIU plugin beside the CRIU it runs, and is
// silent where the plugin is there.
func TestCheckSaysWhetherForkedChildrenCanBeCheckpointed(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	const note = "PyTorch DataLoader workers) cannot be checkpointed here"
	out, _, _ := gpucrEnv(t, drv.env, "check")
	if strings.Contains(out, note) {
		t.Fatalf("check beside the installed plugin says it is missing:\n%s", out)
	}
	// A CRIU with no plugin beside it: a copy, as a system CRIU would be.
	bare := filepath.Join(t.TempDir(), "sbin", "criu")
	if err := os.MkdirAll(filepath.Dir(bare), 0o755); err != nil {
		t.Fatal(err)
	}
	found, err := criu.Find(os.Getenv("GPUCR_CRIU"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("cp", found.Path, bare).CombinedOutput(); err != nil {
		t.Fatalf("copy CRIU: %v %s", err, b)
	}
	out, _, _ = gpucrEnv(t, drv.env, "check", "--criu", bare)
	if !strings.Contains(out, note) {
		t.Fatalf("check beside a CRIU without the plugin does not say so:\n%s", out)
	}
}
