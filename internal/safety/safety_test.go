package safety

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/proctree"
)

func self(t *testing.T) []proctree.Process {
	t.Helper()
	p, err := proctree.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return []proctree.Process{p}
}

func TestIOURingIsRefused(t *testing.T) {
	if err := Check(self(t), nil); err != nil {
		t.Fatalf("before io_uring: %v", err)
	}
	var params [120]byte // struct io_uring_params; the kernel fills it in
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		t.Skipf("io_uring_setup: %v", errno)
	}
	defer syscall.Close(int(fd))
	err := Check(self(t), nil)
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "io_uring") {
		t.Fatalf("with io_uring: %v", err)
	}
}

// The NCCL rule reads a process's mappings and environment: this test maps a file named
// like NCCL's library into itself, so the process it inspects is this one.
func TestNCCLWithoutSocketTransportIsRefused(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libnccl.so.2")
	if err := os.WriteFile(lib, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)

	me := os.Getpid()
	if err := Check(self(t), []int{me}); err != nil {
		t.Fatalf("one GPU process cannot share GPU memory, got %v", err)
	}
	env, _ := os.ReadFile("/proc/self/environ")
	if len(missingEnv(env, ncclSafeEnv)) == 0 {
		t.Skip("this test process already runs with NCCL over sockets")
	}
	err = Check(self(t), []int{me, me})
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1") {
		t.Fatalf("NCCL job on default transports: %v", err)
	}
}

func TestMissingEnv(t *testing.T) {
	env := []byte("A=1\x00NCCL_P2P_DISABLE=1\x00NCCL_SHM_DISABLE=0\x00")
	if got := missingEnv(env, ncclSafeEnv); !slices.Equal(got, []string{"NCCL_SHM_DISABLE=1"}) {
		t.Fatalf("missingEnv = %v", got)
	}
	env = append(env, []byte("NCCL_SHM_DISABLE=1\x00")...)
	if got := missingEnv(env, ncclSafeEnv); len(got) != 0 {
		t.Fatalf("missingEnv = %v, want none", got)
	}
}
