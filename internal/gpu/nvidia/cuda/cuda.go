// Package cuda is gpucr's only binding to libcuda: the driver's process checkpoint API and
// the few device queries NVML lacks, loaded with dlopen so gpucr runs on hosts without a driver.
package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// CUDA 13's ABI, declared here because gpucr builds without cuda.h.
typedef int CUresult;
typedef int CUdevice;
typedef int CUprocessState;
typedef struct { unsigned int timeoutMs; unsigned int reserved0; unsigned long long reserved1[7]; } CUcheckpointLockArgs;
typedef struct { unsigned long long reserved[8]; } CUcheckpointCheckpointArgs;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { CUuuid oldUuid; CUuuid newUuid; } CUcheckpointGpuPair;
typedef struct { CUcheckpointGpuPair *gpuPairs; unsigned int gpuPairsCount; char reserved[44]; unsigned long long reserved1; } CUcheckpointRestoreArgs;
typedef struct { unsigned long long reserved[8]; } CUcheckpointUnlockArgs;
_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "CUcheckpointLockArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointCheckpointArgs) == 64, "CUcheckpointCheckpointArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "CUcheckpointRestoreArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointUnlockArgs) == 64, "CUcheckpointUnlockArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointGpuPair) == 32, "CUcheckpointGpuPair is 32 bytes");

typedef struct {
	CUresult (*driverGetVersion)(int *);
	CUresult (*getErrorName)(CUresult, const char **);
	CUresult (*getErrorString)(CUresult, const char **);
	CUresult (*init)(unsigned int);
	CUresult (*deviceGetCount)(int *);
	CUresult (*deviceGet)(CUdevice *, int);
	CUresult (*deviceGetUuid)(CUuuid *, CUdevice);
	CUresult (*deviceGetAttribute)(int *, int, CUdevice);
	CUresult (*getState)(int, CUprocessState *);
	CUresult (*lock)(int, CUcheckpointLockArgs *);
	CUresult (*checkpoint)(int, CUcheckpointCheckpointArgs *);
	CUresult (*restore)(int, CUcheckpointRestoreArgs *);
	CUresult (*unlock)(int, CUcheckpointUnlockArgs *);
} gpucr_cuda;

// gpucr_cuda_open loads path into c. It returns dlerror's text when the library does not
// load, else NULL; *missing names the first symbol absent, *checkpointAPI is 0 when that
// symbol belongs to the CUDA core (so the library is not libcuda at all).
static const char *gpucr_cuda_open(const char *path, gpucr_cuda *c, const char **missing, int *checkpointAPI) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) return dlerror();
	memset(c, 0, sizeof *c);
	*missing = NULL;
#define SYM(field, name, api) \
	if (!(c->field = dlsym(h, name)) && !*missing) { *missing = name; *checkpointAPI = api; }
	SYM(driverGetVersion, "cuDriverGetVersion", 0)
	SYM(getErrorName, "cuGetErrorName", 0)
	SYM(getErrorString, "cuGetErrorString", 0)
	SYM(init, "cuInit", 0)
	SYM(deviceGetCount, "cuDeviceGetCount", 0)
	SYM(deviceGet, "cuDeviceGet", 0)
	SYM(deviceGetAttribute, "cuDeviceGetAttribute", 0)
	// _v2 reports MIG instances by their own UUID; both take the same arguments.
	c->deviceGetUuid = dlsym(h, "cuDeviceGetUuid_v2");
	if (!c->deviceGetUuid) SYM(deviceGetUuid, "cuDeviceGetUuid", 0)
	SYM(getState, "cuCheckpointProcessGetState", 1)
	SYM(lock, "cuCheckpointProcessLock", 1)
	SYM(checkpoint, "cuCheckpointProcessCheckpoint", 1)
	SYM(restore, "cuCheckpointProcessRestore", 1)
	SYM(unlock, "cuCheckpointProcessUnlock", 1)
#undef SYM
	if (*missing) dlclose(h);
	return NULL;
}

// cgo cannot call through C function pointers, hence one trampoline per call. Each
// argument struct is zeroed: the driver rejects non-zero reserved fields.
static CUresult gpucr_version(gpucr_cuda *c, int *v) { return c->driverGetVersion(v); }
static const char *gpucr_error_name(gpucr_cuda *c, CUresult r) { const char *s = NULL; c->getErrorName(r, &s); return s; }
static const char *gpucr_error_string(gpucr_cuda *c, CUresult r) { const char *s = NULL; c->getErrorString(r, &s); return s; }
static CUresult gpucr_init(gpucr_cuda *c) { return c->init(0); }
static CUresult gpucr_device_count(gpucr_cuda *c, int *n) { return c->deviceGetCount(n); }
static CUresult gpucr_device_uuid(gpucr_cuda *c, int ordinal, CUuuid *u) {
	CUdevice d;
	CUresult r = c->deviceGet(&d, ordinal);
	return r ? r : c->deviceGetUuid(u, d);
}
static CUresult gpucr_device_attribute(gpucr_cuda *c, int ordinal, int attr, int *v) {
	CUdevice d;
	CUresult r = c->deviceGet(&d, ordinal);
	return r ? r : c->deviceGetAttribute(v, attr, d);
}
static CUresult gpucr_state(gpucr_cuda *c, int pid, CUprocessState *st) { return c->getState(pid, st); }
static CUresult gpucr_lock(gpucr_cuda *c, int pid, unsigned int timeoutMs) {
	CUcheckpointLockArgs a;
	memset(&a, 0, sizeof a);
	a.timeoutMs = timeoutMs;
	return c->lock(pid, &a);
}
static CUresult gpucr_checkpoint(gpucr_cuda *c, int pid) {
	CUcheckpointCheckpointArgs a;
	memset(&a, 0, sizeof a);
	return c->checkpoint(pid, &a);
}
static CUresult gpucr_restore(gpucr_cuda *c, int pid, CUcheckpointGpuPair *pairs, unsigned int n) {
	CUcheckpointRestoreArgs a;
	memset(&a, 0, sizeof a);
	a.gpuPairs = pairs;
	a.gpuPairsCount = n;
	return c->restore(pid, &a);
}
static CUresult gpucr_unlock(gpucr_cuda *c, int pid) {
	CUcheckpointUnlockArgs a;
	memset(&a, 0, sizeof a);
	return c->unlock(pid, &a);
}
*/
import "C"

import (
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"time"
	"unsafe"
)

// defaultLibrary is the driver library's soname; a path given to Open (the CLI's
// $GPUCR_LIBCUDA) replaces it, so tests can load a fake driver and users a driver outside
// the loader's path.
const defaultLibrary = "libcuda.so.1"

// Process states as cuCheckpointProcessGetState reports them.
const (
	StateRunning      = 0
	StateLocked       = 1
	StateCheckpointed = 2
	StateFailed       = 3
)

// attrL2CacheSize is CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, in bytes.
const attrL2CacheSize = 38

// Driver is a loaded libcuda. Its methods may be called from any goroutine: the driver
// API is thread-safe.
type Driver struct {
	c C.gpucr_cuda
}

// Error is a driver call that returned something other than CUDA_SUCCESS.
type Error struct {
	Call    string // the driver function, e.g. "cuCheckpointProcessLock"
	Code    int    // the CUresult
	Name    string // e.g. "CUDA_ERROR_TIMEOUT"; empty when the driver has no name for Code
	Message string // the driver's description; may be empty
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = "CUDA error"
	}
	s := fmt.Sprintf("%s: %s (%d)", e.Call, name, e.Code)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// GPUPair sends the device state a process had on GPU Old to GPU New at restore.
type GPUPair struct{ Old, New [16]byte }

// Open loads the CUDA driver library at path; "" means libcuda.so.1 from the loader's
// path. It fails when the driver predates the checkpoint API.
func Open(path string) (*Driver, error) {
	if path == "" {
		path = defaultLibrary
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	d := &Driver{}
	var missing *C.char
	var checkpointAPI C.int
	if msg := C.gpucr_cuda_open(cpath, &d.c, &missing, &checkpointAPI); msg != nil {
		return nil, fmt.Errorf("load CUDA driver library: %s", C.GoString(msg))
	}
	if missing != nil {
		if checkpointAPI != 0 {
			return nil, fmt.Errorf("%s has no %s: the NVIDIA driver is too old for checkpoints (the API needs driver 550 or later, restoring onto other GPUs 580 or later)",
				path, C.GoString(missing))
		}
		return nil, fmt.Errorf("%s is not a CUDA driver library: it has no %s", path, C.GoString(missing))
	}
	return d, nil
}

// check turns a CUresult into an *Error naming call, or nil on success.
func (d *Driver) check(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{
		Call:    call,
		Code:    int(r),
		Name:    C.GoString(C.gpucr_error_name(&d.c, r)),
		Message: C.GoString(C.gpucr_error_string(&d.c, r)),
	}
}

// Version is the CUDA version the driver supports, e.g. 13000 for 13.0.
func (d *Driver) Version() (int, error) {
	var v C.int
	if err := d.check("cuDriverGetVersion", C.gpucr_version(&d.c, &v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Init initializes CUDA in gpucr's own process. Device queries need it, and restore needs
// it unless persistence mode keeps the GPUs initialized. Calling it again is harmless.
func (d *Driver) Init() error {
	return d.check("cuInit", C.gpucr_init(&d.c))
}

// L2CacheSizes returns the L2 cache size in bytes of each device CUDA sees, by UUID in
// NVML's form, because NVML does not report it. It initializes CUDA first.
func (d *Driver) L2CacheSizes() (map[string]uint64, error) {
	if err := d.Init(); err != nil {
		return nil, err
	}
	var n C.int
	if err := d.check("cuDeviceGetCount", C.gpucr_device_count(&d.c, &n)); err != nil {
		return nil, err
	}
	sizes := make(map[string]uint64, int(n))
	for i := range int(n) {
		var u C.CUuuid
		if err := d.check("cuDeviceGetUuid", C.gpucr_device_uuid(&d.c, C.int(i), &u)); err != nil {
			return nil, fmt.Errorf("CUDA device %d: %w", i, err)
		}
		var v C.int
		if err := d.check("cuDeviceGetAttribute", C.gpucr_device_attribute(&d.c, C.int(i), attrL2CacheSize, &v)); err != nil {
			return nil, fmt.Errorf("CUDA device %d L2 cache size: %w", i, err)
		}
		sizes[FormatUUID(*(*[16]byte)(unsafe.Pointer(&u.bytes[0])))] = uint64(v)
	}
	return sizes, nil
}

// State reports where pid stands in the checkpoint cycle (StateRunning...StateFailed).
func (d *Driver) State(pid int) (int, error) {
	var st C.CUprocessState
	if err := d.check("cuCheckpointProcessGetState", C.gpucr_state(&d.c, C.int(pid), &st)); err != nil {
		return 0, err
	}
	return int(st), nil
}

// Lock blocks new CUDA calls in pid and waits up to timeout for submitted work to finish;
// on timeout pid keeps running. A timeout of zero or less waits without limit.
func (d *Driver) Lock(pid int, timeout time.Duration) error {
	return d.check("cuCheckpointProcessLock", C.gpucr_lock(&d.c, C.int(pid), C.uint(timeoutMs(timeout))))
}

// timeoutMs converts timeout to the driver's milliseconds, where 0 means no limit: a
// positive timeout under 1 ms becomes 1 ms rather than unlimited.
func timeoutMs(timeout time.Duration) uint32 {
	switch {
	case timeout <= 0:
		return 0
	case timeout >= time.Duration(math.MaxUint32)*time.Millisecond:
		return math.MaxUint32
	}
	return uint32((timeout + time.Millisecond - 1) / time.Millisecond)
}

// Checkpoint copies a locked pid's device memory into its host memory and releases its GPUs.
func (d *Driver) Checkpoint(pid int) error {
	return d.check("cuCheckpointProcessCheckpoint", C.gpucr_checkpoint(&d.c, C.int(pid)))
}

// Restore brings a checkpointed pid's device state back, leaving it locked. With pairs,
// each GPU of the checkpoint goes to its pair's New GPU; the driver wants every GPU
// listed, as a permutation, and refuses other pairs leaving pid checkpointed.
func (d *Driver) Restore(pid int, pairs []GPUPair) error {
	var cpairs *C.CUcheckpointGpuPair
	if len(pairs) > 0 {
		raw := make([]byte, 0, 32*len(pairs))
		for _, p := range pairs {
			raw = append(append(raw, p.Old[:]...), p.New[:]...)
		}
		// C memory, because the argument struct that points at the pairs is itself in C memory.
		cpairs = (*C.CUcheckpointGpuPair)(C.CBytes(raw))
		defer C.free(unsafe.Pointer(cpairs))
	}
	return d.check("cuCheckpointProcessRestore", C.gpucr_restore(&d.c, C.int(pid), cpairs, C.uint(len(pairs))))
}

// Unlock lets a locked pid make CUDA calls again.
func (d *Driver) Unlock(pid int) error {
	return d.check("cuCheckpointProcessUnlock", C.gpucr_unlock(&d.c, C.int(pid)))
}

// ParseUUID reads a GPU UUID in NVML's form, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
func ParseUUID(s string) ([16]byte, error) {
	var u [16]byte
	groups := strings.Split(strings.TrimPrefix(s, "GPU-"), "-")
	lens := []int{8, 4, 4, 4, 12}
	if !strings.HasPrefix(s, "GPU-") || len(groups) != len(lens) {
		return u, fmt.Errorf("bad GPU UUID %q: want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", s)
	}
	var h strings.Builder
	for i, g := range groups {
		if len(g) != lens[i] {
			return u, fmt.Errorf("bad GPU UUID %q: want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", s)
		}
		h.WriteString(g)
	}
	if _, err := hex.Decode(u[:], []byte(h.String())); err != nil {
		return u, fmt.Errorf("bad GPU UUID %q: %w", s, err)
	}
	return u, nil
}

// FormatUUID writes u in NVML's form, the one ParseUUID reads.
func FormatUUID(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
