// A stand-in for libcuda, so the cuda package's tests run on hosts without a GPU: it keeps
// each pid's checkpoint state in a table and enforces the driver's transitions.
// Every call that changes state appends a line to $FAKECUDA_LOG, so tests see what the
// driver was given. With $FAKEGPU_DIR set, each pid's state lives in the file DIR/PID
// instead (one digit), so that it outlasts the process that set it, as the driver's does:
// a gpucr killed halfway leaves its workload's state for the next gpucr to find.
// A process restored under a new PID (a container's new PID namespace) brings its state
// back in its memory, as with the driver: its restore adopts the state file of the one
// checkpointed process that no longer runs.
// $FAKECUDA_CHECKPOINT_MS makes each checkpoint take that long, as a large one does.
// $FAKECUDA_RESTORE_FAILS=N fails the first N restores the calling process asks for, as
// the driver can while a process is briefly between states.
// Built by the tests with: cc -shared -fPIC [-DOMIT_CHECKPOINT_API]
// [-DOMIT_CORE_API] fakecuda.c -o libfakecuda.so
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef int CUprocessState;
typedef struct { unsigned int timeoutMs; unsigned int reserved0; unsigned long long reserved1[7]; } CUcheckpointLockArgs;
typedef struct { unsigned long long reserved[8]; } CUcheckpointCheckpointArgs;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { CUuuid oldUuid; CUuuid newUuid; } CUcheckpointGpuPair;
typedef struct { CUcheckpointGpuPair *gpuPairs; unsigned int gpuPairsCount; char reserved[44]; unsigned long long reserved1; } CUcheckpointRestoreArgs;
typedef struct { unsigned long long reserved[8]; } CUcheckpointUnlockArgs;

enum { RUNNING, LOCKED, CHECKPOINTED, FAILED };
enum {
	SUCCESS = 0,
	INVALID_VALUE = 1,
	NOT_INITIALIZED = 3,
	INVALID_DEVICE = 101,
	ILLEGAL_STATE = 401,
	TIMEOUT = 909,
};

// The fake waits on processes that do not run as the driver does (waitRuns).
// TIMEOUT_PID is a process whose lock never gets its work drained in time.
#define TIMEOUT_PID 999999
#define DEVICES 2

static struct { int pid, state; } procs[64];
static int nprocs, initialized;

static void record(const char *fmt, ...) {
	const char *path = getenv("FAKECUDA_LOG");
	if (!path) return;
	FILE *f = fopen(path, "a");
	if (!f) return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fclose(f);
}

static int zero(const void *p, size_t n) {
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i]) return 0;
	return 1;
}

// state finds pid's state, adding it as running on first sight; NULL for a bad pid.
static int *state(int pid) {
	if (pid <= 0) return NULL;
	for (int i = 0; i < nprocs; i++)
		if (procs[i].pid == pid) return &procs[i].state;
	if (nprocs == (int)(sizeof procs / sizeof procs[0])) return NULL;
	procs[nprocs].pid = pid;
	procs[nprocs].state = RUNNING;
	return &procs[nprocs++].state;
}

// stateFile is pid's file under $FAKEGPU_DIR, or NULL when states are kept in memory.
static const char *stateFile(int pid, char *buf, size_t n) {
	const char *dir = getenv("FAKEGPU_DIR");
	if (!dir) return NULL;
	snprintf(buf, n, "%s/%d", dir, pid);
	return buf;
}

// load reads pid's state; a pid never seen is running.
static int load(int pid, int *st) {
	char buf[4096];
	const char *path = stateFile(pid, buf, sizeof buf);
	if (!path) {
		int *s = state(pid);
		if (!s) return -1;
		*st = *s;
		return 0;
	}
	if (pid <= 0) return -1;
	FILE *f = fopen(path, "r");
	*st = RUNNING;
	if (f) {
		if (fscanf(f, "%d", st) != 1) *st = RUNNING;
		fclose(f);
	}
	return 0;
}

// store writes pid's state where load reads it, replacing the file whole.
static void store(int pid, int st) {
	char buf[4096], tmp[4200];
	const char *path = stateFile(pid, buf, sizeof buf);
	if (!path) {
		*state(pid) = st;
		return;
	}
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f) return;
	fprintf(f, "%d\n", st);
	fclose(f);
	rename(tmp, path);
}

// move takes pid from state `from` to state `to`, as every checkpoint call does.
static CUresult move(int pid, int from, int to) {
	int st;
	if (load(pid, &st) != 0) return INVALID_VALUE;
	if (st != from) return ILLEGAL_STATE;
	store(pid, to);
	return SUCCESS;
}

// procState is pid's state letter in /proc/PID/stat (R, S, T, Z...); 0 when /proc does not
// know pid, '?' when its line cannot be read.
static char procState(int pid) {
	char file[64], line[4096];
	snprintf(file, sizeof file, "/proc/%d/stat", pid);
	FILE *f = fopen(file, "r");
	if (!f) return 0;
	size_t n = fread(line, 1, sizeof line - 1, f);
	fclose(f);
	line[n] = 0;
	char *end = strrchr(line, ')'); // the state follows the command, which may hold spaces
	return end && end[1] == ' ' ? end[2] : '?';
}

// gone reports whether pid no longer runs: it does not exist, or it is a zombie its
// parent has not reaped yet.
static int gone(int pid) {
	if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
	char st = procState(pid);
	return st == 0 || st == 'Z';
}

// adopt gives pid the state file of the one checkpointed process under $FAKEGPU_DIR that
// no longer runs, when pid has none: pid is that process, restored under a new PID.
static void adopt(int pid) {
	char buf[4096], from[4096];
	const char *dir = getenv("FAKEGPU_DIR");
	if (!dir || access(stateFile(pid, buf, sizeof buf), F_OK) == 0) return;
	DIR *d = opendir(dir);
	if (!d) return;
	int found = 0, old = 0;
	for (struct dirent *e; (e = readdir(d));) {
		int n = atoi(e->d_name), st;
		if (n <= 0 || strspn(e->d_name, "0123456789") != strlen(e->d_name)) continue;
		if (load(n, &st) == 0 && st == CHECKPOINTED && gone(n)) {
			found++;
			old = n;
		}
	}
	closedir(d);
	if (found == 1) rename(stateFile(old, from, sizeof from), buf);
}

static const struct { CUresult code; const char *name, *text; } errors[] = {
	{SUCCESS, "CUDA_SUCCESS", "no error"},
	{INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
	{TIMEOUT, "CUDA_ERROR_TIMEOUT", "the operation timed out"},
};

static CUresult lookup(CUresult code, const char **out, int text) {
	*out = NULL;
	for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
		if (errors[i].code == code) {
			*out = text ? errors[i].text : errors[i].name;
			return SUCCESS;
		}
	return INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult code, const char **name) { return lookup(code, name, 0); }
CUresult cuGetErrorString(CUresult code, const char **text) { return lookup(code, text, 1); }

#ifndef OMIT_CORE_API
CUresult cuDriverGetVersion(int *v) {
	if (!v) return INVALID_VALUE;
	*v = 13000;
	return SUCCESS;
}
#endif

CUresult cuInit(unsigned int flags) {
	if (flags) return INVALID_VALUE;
	initialized = 1;
	return SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	if (!initialized) return NOT_INITIALIZED;
	*n = DEVICES;
	return SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	if (!initialized) return NOT_INITIALIZED;
	if (ordinal < 0 || ordinal >= DEVICES) return INVALID_DEVICE;
	*d = ordinal;
	return SUCCESS;
}

// Device d's UUID is the bytes 16d, 16d+1, ... 16d+15.
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
	if (d < 0 || d >= DEVICES) return INVALID_DEVICE;
	for (int i = 0; i < 16; i++) u->bytes[i] = (char)(16 * d + i);
	return SUCCESS;
}

// Device d has an L2 cache of 50 MiB minus d MiB.
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	if (d < 0 || d >= DEVICES) return INVALID_DEVICE;
	if (attr != 38) return INVALID_VALUE;
	*v = (50 - d) << 20;
	return SUCCESS;
}

#ifndef OMIT_CHECKPOINT_API
CUresult cuCheckpointProcessGetState(int pid, CUprocessState *st) {
	int s;
	adopt(pid);
	if (!st || load(pid, &s) != 0) return INVALID_VALUE;
	*st = s;
	return SUCCESS;
}

// frozenIn reports whether the cgroup file at prefix+path+name holds want.
static int frozenIn(const char *prefix, const char *path, const char *name, const char *want) {
	char file[4096], buf[256];
	snprintf(file, sizeof file, "%s%s/%s", prefix, path, name);
	FILE *f = fopen(file, "r");
	if (!f) return 0;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	return strstr(buf, want) != NULL;
}

// runs is false for a process stopped by a signal or its tracer, or frozen with its cgroup
// (v1's freezer or v2's); true for one that runs, or that /proc does not know.
static int runs(int pid) {
	char st = procState(pid), file[64], line[4096];
	if (st == 0) return 1;
	if (st == 'T' || st == 't') return 0;
	snprintf(file, sizeof file, "/proc/%d/cgroup", pid);
	FILE *f = fopen(file, "r");
	if (!f) return 1;
	int frozen = 0;
	while (!frozen && fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		char *path = strchr(strchr(line, ':') ? strchr(line, ':') + 1 : line, ':');
		if (!path) continue;
		*path++ = 0;
		if (strstr(line, "freezer"))
			frozen = frozenIn("/sys/fs/cgroup/freezer", path, "freezer.state", "FROZEN");
		else if (!strcmp(line, "0:"))
			frozen = frozenIn("/sys/fs/cgroup", path, "cgroup.events", "frozen 1") ||
				 frozenIn("/sys/fs/cgroup/unified", path, "cgroup.events", "frozen 1");
	}
	fclose(f);
	return !frozen;
}

// waitRuns is the real driver on a process that does not run: every checkpoint call waits
// for it, whatever its timeout (measured on the H100). The fake gives up after 10 s with a
// timeout, so that a test of that case fails instead of hanging.
static int waitRuns(int pid, const char *call) {
	for (int i = 0; i < 1000; i++) {
		if (runs(pid)) return 1;
		struct timespec t = {0, 10000000L};
		nanosleep(&t, NULL);
	}
	record("%s %d: waited 10 s on a process that does not run\n", call, pid);
	return 0;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *a) {
	if (a && (a->reserved0 || !zero(a->reserved1, sizeof a->reserved1))) return INVALID_VALUE;
	record("lock %d timeout=%u\n", pid, a ? a->timeoutMs : 0);
	if (!waitRuns(pid, "lock")) return TIMEOUT;
	int s;
	if (load(pid, &s) == 0 && s == RUNNING && pid == TIMEOUT_PID) return TIMEOUT;
	return move(pid, RUNNING, LOCKED);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *a) {
	if (a && !zero(a, sizeof *a)) return INVALID_VALUE;
	record("checkpoint %d\n", pid);
	if (!waitRuns(pid, "checkpoint")) return TIMEOUT;
	const char *ms = getenv("FAKECUDA_CHECKPOINT_MS");
	if (ms) {
		long n = atol(ms);
		struct timespec t = {n / 1000, (n % 1000) * 1000000L};
		nanosleep(&t, NULL);
	}
	return move(pid, LOCKED, CHECKPOINTED);
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *a) {
	if (a && (!zero(a->reserved, sizeof a->reserved) || a->reserved1)) return INVALID_VALUE;
	if (a && a->gpuPairsCount && !a->gpuPairs) return INVALID_VALUE;
	unsigned int n = a ? a->gpuPairsCount : 0;
	record("restore %d pairs=%u", pid, n);
	for (unsigned int i = 0; i < n; i++) {
		record(" ");
		for (int j = 0; j < 16; j++) record("%02x", (unsigned char)a->gpuPairs[i].oldUuid.bytes[j]);
		record(">");
		for (int j = 0; j < 16; j++) record("%02x", (unsigned char)a->gpuPairs[i].newUuid.bytes[j]);
	}
	record("\n");
	if (!waitRuns(pid, "restore")) return TIMEOUT;
	static int failed;
	const char *fails = getenv("FAKECUDA_RESTORE_FAILS");
	if (fails && failed < atoi(fails)) {
		failed++;
		return INVALID_VALUE;
	}
	adopt(pid);
	return move(pid, CHECKPOINTED, LOCKED);
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *a) {
	if (a && !zero(a, sizeof *a)) return INVALID_VALUE;
	record("unlock %d\n", pid);
	if (!waitRuns(pid, "unlock")) return TIMEOUT;
	return move(pid, LOCKED, RUNNING);
}
#endif
