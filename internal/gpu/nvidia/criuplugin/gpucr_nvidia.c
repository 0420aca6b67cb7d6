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
 * Each descriptor's device is recorded in the image as gpucr-nvidia-file-ID: its path.
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

/* is_nvidia_name says whether path names an NVIDIA device node, as the driver makes them. */
static int is_nvidia_name(const char *path)
{
	static const char *const fixed[] = { "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
					     "/dev/nvidia-modeset", NULL };
	const char *p;
	int i;

	for (i = 0; fixed[i]; i++)
		if (!strcmp(path, fixed[i]))
			return 1;
	if (!strncmp(path, "/dev/nvidia-caps/nvidia-cap", 27))
		p = path + 27;
	else if (!strncmp(path, "/dev/nvidia", 11))
		p = path + 11;
	else
		return 0;
	if (!*p)
		return 0;
	for (; *p; p++)
		if (*p < '0' || *p > '9')
			return 0;
	return 1;
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
	char path[256], name[64];
	struct stat st;
	int out, n, ret;

	if (fstat(fd, &st) || !is_nvidia_device(&st))
		return -ENOTSUP;
	ret = fd_path(fd, path, sizeof(path));
	if (ret)
		return ret;
	if (!is_nvidia_name(path)) {
		fprintf(stderr, "gpucr_nvidia: NVIDIA device at %s, not a path the driver makes\n", path);
		return -EINVAL;
	}
	snprintf(name, sizeof(name), RECORD, id);
	out = openat(criu_get_image_dir(), name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (out < 0)
		return -errno;
	n = dprintf(out, "%s\n", path);
	ret = n < 0 || fsync(out) ? -EIO : 0;
	close(out);
	return ret;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__DUMP_EXT_FILE, nvidia_dump_file)

static int nvidia_restore_file(int id)
{
	char path[256], name[64];
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
	if (!is_nvidia_name(path)) {
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
	char abs[256];
	int fd;

	snprintf(abs, sizeof(abs), "%s%s", path[0] == '/' ? "" : "/", path);
	if (!is_nvidia_name(abs))
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
