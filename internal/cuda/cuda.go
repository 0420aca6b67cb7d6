// Package cuda is gpucr's only binding to libcuda: the driver's process checkpoint API,
// loaded with dlopen at run time so gpucr starts on hosts without an NVIDIA driver.
package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// The CUDA 13 ABI of the checkpoint API, declared here because gpucr builds without cuda.h.
typedef int CUresult;
typedef int CUdevice;
typedef struct { unsigned int timeoutMs; unsigned int reserved0; unsigned long long reserved1[7]; } CUcheckpointLockArgs;
typedef struct { unsigned long long reserved[8]; } CUcheckpointCheckpointArgs;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { CUuuid oldUuid; CUuuid newUuid; } CUcheckpointGpuPair;
typedef struct { CUcheckpointGpuPair *gpuPairs; unsigned int gpuPairsCount; char reserved[44]; unsigned long long reserved1; } CUcheckpointRestoreArgs;
typedef struct { unsigned long long reserved[8]; } CUcheckpointUnlockArgs;
_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "lock args");
_Static_assert(sizeof(CUcheckpointCheckpointArgs) == 64, "checkpoint args");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "restore args");
_Static_assert(sizeof(CUcheckpointUnlockArgs) == 64, "unlock args");

typedef struct {
	CUresult (*getState)(int, int *);
	CUresult (*lock)(int, CUcheckpointLockArgs *);
	CUresult (*checkpoint)(int, CUcheckpointCheckpointArgs *);
	CUresult (*restore)(int, CUcheckpointRestoreArgs *);
	CUresult (*unlock)(int, CUcheckpointUnlockArgs *);
	CUresult (*driverVersion)(int *);
	CUresult (*errorName)(CUresult, const char **);
	CUresult (*errorString)(CUresult, const char **);
	CUresult (*init)(unsigned int);
	CUresult (*deviceCount)(int *);
	CUresult (*deviceGet)(CUdevice *, int);
	CUresult (*deviceUuid)(CUuuid *, CUdevice);
	CUresult (*deviceAttr)(int *, int, CUdevice);
} gpucr_cuda;

static const char *gpucr_cuda_open(const char *path, gpucr_cuda *c, void **handle) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) return dlerror();
	*handle = h;
	memset(c, 0, sizeof *c);
	c->getState = dlsym(h, "cuCheckpointProcessGetState");
	c->lock = dlsym(h, "cuCheckpointProcessLock");
	c->checkpoint = dlsym(h, "cuCheckpointProcessCheckpoint");
	c->restore = dlsym(h, "cuCheckpointProcessRestore");
	c->unlock = dlsym(h, "cuCheckpointProcessUnlock");
	c->driverVersion = dlsym(h, "cuDriverGetVersion");
	c->errorName = dlsym(h, "cuGetErrorName");
	c->errorString = dlsym(h, "cuGetErrorString");
	c->init = dlsym(h, "cuInit");
	c->deviceCount = dlsym(h, "cuDeviceGetCount");
	c->deviceGet = dlsym(h, "cuDeviceGet");
	c->deviceUuid = dlsym(h, "cuDeviceGetUuid_v2");
	if (!c->deviceUuid) c->deviceUuid = dlsym(h, "cuDeviceGetUuid");
	c->deviceAttr = dlsym(h, "cuDeviceGetAttribute");
	return NULL;
}

static int gpucr_cuda_complete(gpucr_cuda *c) {
	return c->getState && c->lock && c->checkpoint && c->restore && c->unlock && c->driverVersion && c->errorName && c->errorString;
}

static CUresult call_state(gpucr_cuda *c, int pid, int *st) { return c->getState(pid, st); }
static CUresult call_lock(gpucr_cuda *c, int pid, unsigned int ms) {
	CUcheckpointLockArgs a; memset(&a, 0, sizeof a); a.timeoutMs = ms; return c->lock(pid, &a);
}
static CUresult call_checkpoint(gpucr_cuda *c, int pid) {
	CUcheckpointCheckpointArgs a; memset(&a, 0, sizeof a); return c->checkpoint(pid, &a);
}
// pairs holds n old/new UUID pairs, 32 bytes each.
static CUresult call_restore(gpucr_cuda *c, int pid, void *pairs, unsigned int n) {
	CUcheckpointRestoreArgs a; memset(&a, 0, sizeof a);
	a.gpuPairs = pairs; a.gpuPairsCount = n;
	return c->restore(pid, &a);
}
static CUresult call_unlock(gpucr_cuda *c, int pid) {
	CUcheckpointUnlockArgs a; memset(&a, 0, sizeof a); return c->unlock(pid, &a);
}
static CUresult call_version(gpucr_cuda *c, int *v) { return c->driverVersion(v); }
static const char *call_name(gpucr_cuda *c, CUresult r) { const char *s = NULL; c->errorName(r, &s); return s; }
static const char *call_string(gpucr_cuda *c, CUresult r) { const char *s = NULL; c->errorString(r, &s); return s; }
static CUresult call_init(gpucr_cuda *c) { return c->init ? c->init(0) : 3; }
static CUresult call_count(gpucr_cuda *c, int *n) { return c->deviceCount ? c->deviceCount(n) : 3; }
static CUresult call_uuid(gpucr_cuda *c, int i, void *out) {
	CUdevice d; CUresult r;
	if (!c->deviceGet || !c->deviceUuid) return 3;
	if ((r = c->deviceGet(&d, i))) return r;
	return c->deviceUuid((CUuuid *)out, d);
}
static CUresult call_attr(gpucr_cuda *c, int i, int attr, int *v) {
	CUdevice d; CUresult r;
	if (!c->deviceGet || !c->deviceAttr) return 3;
	if ((r = c->deviceGet(&d, i))) return r;
	return c->deviceAttr(v, attr, d);
}
*/
import "C"

import (
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"
)

// Driver is an opened libcuda.
type Driver struct {
	c C.gpucr_cuda
}

// Error is a failed driver call.
type Error struct {
	Call    string
	Code    int
	Name    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Message)
}

// Process states as the driver reports them.
const (
	StateRunning      = 0
	StateLocked       = 1
	StateCheckpointed = 2
	StateFailed       = 3
)

// Open loads libcuda from path ("" means libcuda.so.1, or $GPUCR_LIBCUDA when set).
func Open(path string) (*Driver, error) {
	if path == "" {
		path = os.Getenv("GPUCR_LIBCUDA")
	}
	if path == "" {
		path = "libcuda.so.1"
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	d := &Driver{}
	var handle unsafe.Pointer
	if msg := C.gpucr_cuda_open(cpath, &d.c, &handle); msg != nil {
		return nil, fmt.Errorf("load %s: %s", path, C.GoString(msg))
	}
	if C.gpucr_cuda_complete(&d.c) == 0 {
		return nil, fmt.Errorf("%s has no process checkpoint API: the NVIDIA driver is too old (needs >= 550; GPU remapping needs >= 580)", path)
	}
	return d, nil
}

func (d *Driver) err(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: C.GoString(C.call_name(&d.c, r)), Message: C.GoString(C.call_string(&d.c, r))}
}

// Version is the driver's CUDA version, e.g. 13000 for 13.0.
func (d *Driver) Version() (int, error) {
	var v C.int
	if err := d.err("cuDriverGetVersion", C.call_version(&d.c, &v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// State reports pid's checkpoint state.
func (d *Driver) State(pid int) (int, error) {
	var st C.int
	if err := d.err("cuCheckpointProcessGetState", C.call_state(&d.c, C.int(pid), &st)); err != nil {
		return 0, err
	}
	return int(st), nil
}

// Lock blocks new CUDA work in pid, waiting up to timeout for work in flight.
func (d *Driver) Lock(pid int, timeout time.Duration) error {
	return d.err("cuCheckpointProcessLock", C.call_lock(&d.c, C.int(pid), C.uint(timeout.Milliseconds())))
}

// Checkpoint moves pid's device memory into its host memory and releases the GPU.
func (d *Driver) Checkpoint(pid int) error {
	return d.err("cuCheckpointProcessCheckpoint", C.call_checkpoint(&d.c, C.int(pid)))
}

// GPUPair maps a device of the checkpoint (Old) to a device of this host (New).
type GPUPair struct{ Old, New [16]byte }

// Restore brings pid's device state back, onto other devices where pairs say so.
func (d *Driver) Restore(pid int, pairs []GPUPair) error {
	var buf unsafe.Pointer
	if len(pairs) > 0 {
		buf = C.malloc(C.size_t(32 * len(pairs))) // C memory: the driver may keep no Go pointer
		defer C.free(buf)
		b := unsafe.Slice((*byte)(buf), 32*len(pairs))
		for i, p := range pairs {
			copy(b[32*i:], p.Old[:])
			copy(b[32*i+16:], p.New[:])
		}
	}
	return d.err("cuCheckpointProcessRestore", C.call_restore(&d.c, C.int(pid), buf, C.uint(len(pairs))))
}

// Unlock lets pid submit CUDA work again.
func (d *Driver) Unlock(pid int) error {
	return d.err("cuCheckpointProcessUnlock", C.call_unlock(&d.c, C.int(pid)))
}

// cuDeviceAttributeL2CacheSize is CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE.
const cuDeviceAttributeL2CacheSize = 38

// L2CacheSizes returns each CUDA device's L2 cache size by UUID ("GPU-…"), which NVML does
// not report. It initializes CUDA in gpucr's own process.
func (d *Driver) L2CacheSizes() (map[string]uint64, error) {
	if err := d.err("cuInit", C.call_init(&d.c)); err != nil {
		return nil, err
	}
	var n C.int
	if err := d.err("cuDeviceGetCount", C.call_count(&d.c, &n)); err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for i := 0; i < int(n); i++ {
		var u [16]byte
		if err := d.err("cuDeviceGetUuid", C.call_uuid(&d.c, C.int(i), unsafe.Pointer(&u[0]))); err != nil {
			return nil, err
		}
		var v C.int
		if err := d.err("cuDeviceGetAttribute", C.call_attr(&d.c, C.int(i), cuDeviceAttributeL2CacheSize, &v)); err != nil {
			return nil, err
		}
		out[FormatUUID(u)] = uint64(v)
	}
	return out, nil
}

// ParseUUID reads NVML's "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" form.
func ParseUUID(s string) ([16]byte, error) {
	var u [16]byte
	h := strings.ReplaceAll(strings.TrimPrefix(s, "GPU-"), "-", "")
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != 16 {
		return u, fmt.Errorf("bad GPU UUID %q", s)
	}
	copy(u[:], b)
	return u, nil
}

// FormatUUID writes u in NVML's form.
func FormatUUID(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}
