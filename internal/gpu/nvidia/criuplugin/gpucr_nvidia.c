/*
 * gpucr's CRIU plugin for the NVIDIA device files of processes without CUDA state.
 *
 * A process forked after its parent started CUDA (a PyTorch DataLoader worker, by default)
 * inherits the parent's descriptors of /dev/nvidia* and its shared mappings of them, but no
 * CUDA context: the driver's checkpoint leaves them alone, and CRIU cannot dump a device it
 * does not know. Such a process can never use them (CUDA refuses a forked child), so this
 * plugin dumps each descriptor as its device's path and, on restore, opens that device again;
 * each mapping comes back as shared memory of the same size and place, zero-filled, in place
 * of the parent's driver memory it showed before the checkpoint. gpucr loads it only for
 * trees it found to hold such processes (the NVIDIA backend's analysis); processes with CUDA
 * state hold no device files by then, the driver having closed them.
 *
 * Each descriptor's device is recorded in the image as gpucr-nvidia-file-ID: its path under
 * /dev, as the driver names it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "criu-plugin.h"

#define RECORD "gpucr-nvidia-file-%x"

/*
 * canonical writes to out the path under /dev at which the NVIDIA driver makes the device
 * whose node path names (by its last element: a container's bind mount of /dev/nvidiactl
 * may read as /nvidiactl from CRIU's mount namespace), and returns 0; -1 if that is no
 * NVIDIA device node's name.
 */
static int canonical(const char *path, char *out, size_t size)
{
	static const char *const fixed[] = { "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", NULL };
	const char *base = strrchr(path, '/'), *p;
	int i;

	base = base ? base + 1 : path;
	for (i = 0; fixed[i]; i++)
		if (!strcmp(base, fixed[i]))
			return snprintf(out, size, "/dev/%s", base) < (int)size ? 0 : -1;
	if (!strncmp(base, "nvidia-cap", 10))
		p = base + 10;
	else if (!strncmp(base, "nvidia", 6))
		p = base + 6;
	else
		return -1;
	if (!*p || strlen(p) > 4)
		return -1;
	for (; *p; p++)
		if (*p < '0' || *p > '9')
			return -1;
	if (!strncmp(base, "nvidia-cap", 10))
		return snprintf(out, size, "/dev/nvidia-caps/%s", base) < (int)size ? 0 : -1;
	return snprintf(out, size, "/dev/%s", base) < (int)size ? 0 : -1;
}

/*
 * is_nvidia_major says whether a character device's major number is one the NVIDIA driver
 * registered (/proc/devices: nvidia, nvidia-frontend, nvidia-uvm, nvidia-caps, ...).
 */
static int is_nvidia_major(unsigned int major)
{
	char line[128], name[96];
	unsigned int m;
	int found = 0;
	FILE *f = fopen("/proc/devices", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "Block", 5))
			break;
		if (sscanf(line, "%u %95s", &m, name) == 2 && m == major && !strncmp(name, "nvidia", 6)) {
			found = 1;
			break;
		}
	}
	fclose(f);
	return found;
}

static int is_nvidia_device(const struct stat *st)
{
	return S_ISCHR(st->st_mode) && is_nvidia_major(major(st->st_rdev));
}

static int fd_path(int fd, char *buf, size_t size)
{
	char link[64];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, buf, size - 1);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return 0;
}

static int nvidia_dump_file(int fd, int id)
{
	char path[256], dev[64], name[64];
	struct stat st;
	int out, n, ret;

	if (fstat(fd, &st) || !is_nvidia_device(&st))
		return -ENOTSUP;
	ret = fd_path(fd, path, sizeof(path));
	if (ret)
		return ret;
	if (canonical(path, dev, sizeof(dev))) {
		fprintf(stderr, "gpucr_nvidia: NVIDIA device at %s, not a name the driver gives\n", path);
		return -EINVAL;
	}
	snprintf(name, sizeof(name), RECORD, id);
	out = openat(criu_get_image_dir(), name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (out < 0)
		return -errno;
	n = dprintf(out, "%s\n", dev);
	ret = n < 0 || fsync(out) ? -EIO : 0;
	close(out);
	return ret;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__DUMP_EXT_FILE, nvidia_dump_file)

static int nvidia_restore_file(int id)
{
	char path[256], dev[64], name[64];
	struct stat st;
	ssize_t n;
	int in, fd;

	snprintf(name, sizeof(name), RECORD, id);
	in = openat(criu_get_image_dir(), name, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return errno == ENOENT ? -ENOTSUP : -errno;
	n = read(in, path, sizeof(path) - 1);
	close(in);
	if (n <= 1 || path[n - 1] != '\n')
		return -EINVAL;
	path[n - 1] = '\0';
	/* The image names the device; anything but an NVIDIA device node is refused. */
	if (canonical(path, dev, sizeof(dev)) || strcmp(path, dev)) {
		fprintf(stderr, "gpucr_nvidia: %s names %s, not an NVIDIA device\n", name, path);
		return -EINVAL;
	}
	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		fprintf(stderr, "gpucr_nvidia: open %s: %s\n", path, strerror(errno));
		return -errno;
	}
	if (fstat(fd, &st) || !is_nvidia_device(&st)) {
		fprintf(stderr, "gpucr_nvidia: %s is not an NVIDIA device here\n", path);
		close(fd);
		return -EINVAL;
	}
	return fd;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__RESTORE_EXT_FILE, nvidia_restore_file)

static int nvidia_handle_vma(int fd, const struct stat *st)
{
	return is_nvidia_device(st) ? 0 : -ENOTSUP;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA, nvidia_handle_vma)

static int nvidia_update_vma(const char *path, const uint64_t addr, const uint64_t old_pgoff, uint64_t *new_pgoff,
			     int *plugin_fd)
{
	char dev[64];
	int fd;

	if (canonical(path, dev, sizeof(dev)))
		return -ENOTSUP;
	fd = open("/dev/zero", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	*new_pgoff = 0;
	*plugin_fd = fd;
	return 1;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__UPDATE_VMA_MAP, nvidia_update_vma)

CR_PLUGIN_REGISTER_DUMMY("gpucr_nvidia")
