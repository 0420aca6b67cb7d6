/* Runs the plugin's hooks on what an image could hold, printing one line per case:
 * harness IMAGE-DIR. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include "../gpucr_nvidia.c"

static int image_dir = -1;
int criu_get_image_dir(void) { return image_dir; }

int main(int argc, char **argv)
{
	static const char *const names[] = { "/dev/nvidiactl", "/nvidiactl", "nvidia0", "/dev/nvidia12",
		"/dev/nvidia-uvm", "/x/nvidia-uvm-tools", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-modeset",
		"/dev/nvidia", "/dev/nvidiax", "/etc/shadow", "/dev/nvidia-cap", "/dev/nvidia123456",
		"/dev/nvidia-uvmx", "/lib/libc.so.6", NULL };
	char out[64];
	uint64_t pgoff;
	int i, fd, ret;
	struct stat st;

	if (argc != 2 || (image_dir = open(argv[1], O_RDONLY | O_DIRECTORY)) < 0)
		return 2;
	for (i = 0; names[i]; i++) {
		ret = canonical(names[i], out, sizeof(out));
		printf("canonical %s %d %s\n", names[i], ret, ret ? "-" : out);
	}
	/* The records a crafted image may hold, by ID: see the test. */
	for (i = 1; i <= 5; i++) {
		ret = nvidia_restore_file(i);
		printf("restore %d %s\n", i, ret >= 0 ? "opened" : ret == -ENOTSUP ? "not-mine" : "refused");
		if (ret >= 0)
			close(ret);
	}
	for (i = 0; names[i]; i++) {
		fd = -1;
		pgoff = 7;
		ret = nvidia_update_vma(names[i], 0x1000, 0x2000, &pgoff, &fd);
		if (ret == 1 && (fstat(fd, &st) || !S_ISCHR(st.st_mode) || st.st_rdev != makedev(1, 5) || pgoff))
			ret = -100; /* not /dev/zero at offset 0 */
		printf("vma %s %d\n", names[i], ret);
		if (fd >= 0)
			close(fd);
	}
	/* No device here is NVIDIA's: the dump hooks pass every one to the next plugin. */
	fd = open("/dev/null", O_RDWR);
	if (fd < 0 || fstat(fd, &st))
		return 2;
	printf("dump /dev/null %d\n", nvidia_dump_file(fd, 9));
	printf("handle /dev/null %d\n", nvidia_handle_vma(fd, &st));
	close(fd);
	return 0;
}
