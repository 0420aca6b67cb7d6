package nvidia

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/gpu"
)

// deviceMajor is the character major of the driver's GPU nodes, /dev/nvidiaN, where N is
// the GPU's minor number as NVML reports it (nvidiactl is 255 on the same major).
const deviceMajor = 195

var gpuNode = regexp.MustCompile(`^nvidia[0-9]+$`)

// reachable narrows host to the GPUs whose device nodes exist under root: a container's
// /dev holds only those its engine, device plugin or CDI gave it, and its restored
// processes can be put back only on those, whichever GPUs they ran on before.
func (b *Backend) reachable(host gpu.Host, root string) (gpu.Host, error) {
	minors, err := deviceMinors(root)
	if err != nil {
		return gpu.Host{}, err
	}
	var in []gpu.Device
	for _, d := range host.Devices {
		dev, r := b.nvml.DeviceGetHandleByUUID(d.UUID)
		if r != nvml.SUCCESS {
			return gpu.Host{}, nvmlError(fmt.Sprintf("GPU %d handle", d.Index), r)
		}
		minor, r := dev.GetMinorNumber()
		switch {
		case r == nvml.ERROR_NOT_SUPPORTED: // no node to tell by: not ruled out, as before
			in = append(in, d)
			continue
		case r != nvml.SUCCESS:
			return gpu.Host{}, nvmlError(fmt.Sprintf("GPU %d minor number", d.Index), r)
		}
		if minors[minor] {
			in = append(in, d)
		}
	}
	if len(in) == 0 {
		return gpu.Host{}, fmt.Errorf("the restored processes can reach none of this host's %d NVIDIA GPUs (no /dev/nvidiaN of theirs in %s): give the container the GPUs to restore onto", len(host.Devices), filepath.Join(root, "dev"))
	}
	host.Devices = in
	return host, nil
}

// deviceMinors lists the minor numbers of the NVIDIA GPU nodes in root's /dev: character
// devices of the driver's major named nvidiaN. A node's name alone proves nothing, nor does
// a symlink, there or as /dev itself: read from the host, it names a node of the host's
// choosing, not one the container was given (hostile tests' containers linked /dev/nvidia1,
// and then their whole /dev, to the host's and had their GPU state moved onto its GPUs).
// So /dev is opened beneath root with no symlink followed, and its entries are looked at
// through it.
func deviceMinors(root string) (map[int]bool, error) {
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the restored processes' root %s: %w", root, err)
	}
	defer unix.Close(rootfd)
	devfd, err := unix.Openat2(rootfd, "dev", &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, fmt.Errorf("open the restored processes' devices %s (a symlink is refused): %w", filepath.Join(root, "dev"), err)
	}
	dev := os.NewFile(uintptr(devfd), filepath.Join(root, "dev"))
	defer dev.Close()
	entries, err := dev.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("list the restored processes' devices: %w", err)
	}
	minors := map[int]bool{}
	for _, e := range entries {
		if !gpuNode.MatchString(e.Name()) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(devfd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, fmt.Errorf("stat %s: %w", filepath.Join(root, "dev", e.Name()), err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && unix.Major(st.Rdev) == deviceMajor {
			minors[int(unix.Minor(st.Rdev))] = true
		}
	}
	return minors, nil
}
