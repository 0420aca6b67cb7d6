// A stand-in for libnvidia-ml, so gpucr's binary finds GPU processes on hosts without a GPU
// (CI): two devices whose UUIDs match fakecuda.c's, and as compute processes on device 0
// every live PID that has a state file in $FAKEGPU_DIR (the file fakecuda.c keeps the
// process's checkpoint state in). Built by the tests with:
// cc -shared -fPIC fakenvml.c -o libfakenvml.so
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct { int index; } *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

enum { SUCCESS = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6, INSUFFICIENT_SIZE = 7 };
#define DEVICES 2
static struct { int index; } devices[DEVICES] = {{0}, {1}};

nvmlReturn_t nvmlInit_v2(void) { return SUCCESS; }
nvmlReturn_t nvmlInit(void) { return SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return SUCCESS; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == SUCCESS ? "Success" : "fake NVML error"; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) {
	snprintf(v, n, "580.0");
	return SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = 13000; return SUCCESS; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return SUCCESS; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = DEVICES; return SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { *n = DEVICES; return SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
	if (i >= DEVICES) return INVALID_ARGUMENT;
	*d = (nvmlDevice_t)&devices[i];
	return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }

// Device d's UUID is the bytes 16d ... 16d+15, as fakecuda.c reports them.
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *u, unsigned int n) {
	unsigned char b[16];
	for (int i = 0; i < 16; i++) b[i] = (unsigned char)(16 * d->index + i);
	snprintf(u, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
	return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
	char u[96];
	for (int i = 0; i < DEVICES; i++) {
		nvmlDeviceGetUUID((nvmlDevice_t)&devices[i], u, sizeof u);
		if (strcmp(u, uuid) == 0) {
			*d = (nvmlDevice_t)&devices[i];
			return SUCCESS;
		}
	}
	return NOT_FOUND;
}
// Device d's node is /dev/nvidia<d>, as on a real host.
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) { *minor = d->index; return SUCCESS; }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int n) {
	snprintf(name, n, "Fake GPU %d", d->index);
	return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
	(void)d;
	*major = 9;
	*minor = 0;
	return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	(void)d;
	m->total = 80ULL << 30;
	m->used = 1ULL << 30;
	m->free = m->total - m->used;
	return SUCCESS;
}
static nvmlReturn_t pci(nvmlDevice_t d, nvmlPciInfo_t *p) {
	memset(p, 0, sizeof *p);
	p->bus = 0x10 + d->index;
	snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
	snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", p->bus);
	return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci(d, p); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci(d, p); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci(d, p); }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending) {
	(void)d; (void)cur; (void)pending;
	return NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, int *cur, int *pending) {
	(void)d;
	*cur = *pending = 1;
	return SUCCESS;
}

// Compute processes: the live PIDs with a state file in $FAKEGPU_DIR, all on device 0.
static nvmlReturn_t procs(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *out) {
	unsigned int n = 0;
	const char *dir = getenv("FAKEGPU_DIR");
	/* FAKENVML_PROCESS_MEMORY: the device memory each process uses, in bytes (1 MiB). */
	const char *mem = getenv("FAKENVML_PROCESS_MEMORY");
	unsigned long long used = mem ? strtoull(mem, NULL, 10) : 1 << 20;
	DIR *dp = (dir && d->index == 0) ? opendir(dir) : NULL;
	struct dirent *e;
	while (dp && (e = readdir(dp))) {
		int pid = atoi(e->d_name);
		if (pid <= 0 || kill(pid, 0) != 0) continue;
		if (n < *count && out) {
			memset(&out[n], 0, sizeof out[n]);
			out[n].pid = (unsigned int)pid;
			out[n].usedGpuMemory = used;
			out[n].gpuInstanceId = out[n].computeInstanceId = 0xFFFFFFFF;
		}
		n++;
	}
	if (dp) closedir(dp);
	int fits = n <= *count;
	*count = n;
	return fits ? SUCCESS : INSUFFICIENT_SIZE;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { return procs(d, c, p); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { return procs(d, c, p); }
