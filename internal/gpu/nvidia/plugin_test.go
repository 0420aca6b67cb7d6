package nvidia

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
)

// gpucr's CRIU plugin (criuplugin/gpucr_nvidia.c) opens, on restore, only a device node the
// NVIDIA driver names, whatever a crafted image records, and maps zeros only over mappings
// of such nodes: its checks of image data run here, in CI, where there is no NVIDIA device.
func TestPluginOpensOnlyNVIDIADevices(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc here: the plugin is built where gpucr's CRIU is (scripts/install-deps.sh)")
	}
	bin := filepath.Join(t.TempDir(), "harness")
	if out, err := exec.Command(gcc, "-Wall", "-Werror", "-iquote", "criuplugin/testdata", "-o", bin, "criuplugin/testdata/harness.c").CombinedOutput(); err != nil {
		t.Fatalf("build the harness: %v\n%s", err, out)
	}
	img := t.TempDir()
	records := map[string]string{
		"gpucr-nvidia-file-1": "/etc/shadow\n",
		"gpucr-nvidia-file-2": "/dev/nvidiactl", // no newline: cut short
		"gpucr-nvidia-file-3": "/dev/../etc/shadow\n",
		"gpucr-nvidia-file-4": "/nvidiactl\n", // a name the driver gives, not at its place
		// 5: none recorded, another plugin's
	}
	for name, body := range records {
		if err := os.WriteFile(filepath.Join(img, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(bin, img).CombinedOutput()
	if err != nil {
		t.Fatalf("harness: %v\n%s", err, out)
	}
	got := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		got[line] = true
	}
	want := []string{
		"canonical /dev/nvidiactl 0 /dev/nvidiactl",
		"canonical /nvidiactl 0 /dev/nvidiactl",
		"canonical /dev/nvidia12 0 /dev/nvidia12",
		"canonical /x/nvidia-uvm-tools 0 /dev/nvidia-uvm-tools",
		"canonical /dev/nvidia-caps/nvidia-cap1 0 /dev/nvidia-caps/nvidia-cap1",
		"canonical /dev/nvidia -1 -",
		"canonical /dev/nvidiax -1 -",
		"canonical /etc/shadow -1 -",
		"canonical /dev/nvidia-cap -1 -",
		"canonical /dev/nvidia123456 -1 -",
		"canonical /dev/nvidia-uvmx -1 -",
		"restore 1 refused",
		"restore 2 refused",
		"restore 3 refused",
		"restore 4 refused",
		"restore 5 not-mine",
		"vma /dev/nvidiactl 1",
		"vma /nvidiactl 1",
		"vma /dev/nvidia-uvm 1",
		"vma /etc/shadow -95",
		"vma /lib/libc.so.6 -95",
		"vma /dev/nvidiax -95",
		"dump /dev/null -95",
		"handle /dev/null -95",
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("missing %q", w)
		}
	}
	if t.Failed() {
		t.Logf("harness said:\n%s", out)
	}
}

// Where the backend is off, an image holding the plugin's records is refused up front, as an
// AMD image is (gpu.Vendor.ImageFiles): a crafted one whose GPU record named none of their
// processes failed in CRIU's restore instead.
func TestOffBackendKnowsThePluginRecords(t *testing.T) {
	for _, v := range gpu.Vendors() {
		if v.Name != Name {
			continue
		}
		for _, p := range v.ImageFiles {
			if ok, _ := filepath.Match(p, "gpucr-nvidia-file-1f"); ok {
				return
			}
		}
		t.Fatalf("the NVIDIA vendor's image files %q do not match the plugin's records", v.ImageFiles)
	}
	t.Fatal("no NVIDIA vendor registered")
}
