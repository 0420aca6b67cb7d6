// Package safety finds, before any GPU is locked, what would make a checkpoint fail or,
// worse, succeed and never restore: a checkpoint that cannot be restored is data loss.
package safety

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpucr/gpucr/internal/proctree"
)

// ErrUnsafe marks a tree gpucr refuses to checkpoint.
var ErrUnsafe = errors.New("cannot checkpoint safely")

// Finding is one reason a tree cannot be checkpointed, with what the user can do about it.
type Finding struct {
	PID     int
	Command string
	Reason  string
	Fix     string
}

func (f *Finding) Error() string {
	return fmt.Sprintf("process %d (%s) %s; %s", f.PID, f.Command, f.Reason, f.Fix)
}

func (f *Finding) Is(target error) bool { return target == ErrUnsafe }

// ncclSafeEnv is what a job needs so that NCCL moves data between its processes over
// sockets only. Measured with driver 580: with NCCL's P2P (CUDA IPC) or SHM (shared pinned
// host memory) transports on, the driver locks and checkpoints every rank and then cannot
// restore any of them.
var ncclSafeEnv = []string{"NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1"}

// NCCLSafeEnv returns the environment settings that make an NCCL job checkpointable.
func NCCLSafeEnv() []string { return append([]string(nil), ncclSafeEnv...) }

// Check inspects the tree; gpuPIDs are its processes that hold GPU state. It returns the
// first finding, or nil.
func Check(tree []proctree.Process, gpuPIDs []int) error {
	if err := checkNCCL(gpuPIDs); err != nil {
		return err
	}
	for _, p := range tree {
		if has, err := holdsIOURing(p.PID); err == nil && has {
			return &Finding{p.PID, p.Command, "holds an io_uring instance, which CRIU cannot checkpoint",
				"stop the program from using io_uring (torchrun's agent does; launch the job with gpucr run instead)"}
		}
	}
	return nil
}

// checkNCCL refuses several GPU processes that use NCCL without its socket-only settings:
// one GPU process alone cannot share device memory with another in the tree.
func checkNCCL(gpuPIDs []int) error {
	if len(gpuPIDs) < 2 {
		return nil
	}
	for _, pid := range gpuPIDs {
		nccl, err := mapsLibrary(pid, "libnccl")
		if err != nil || !nccl {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
		if err != nil {
			continue
		}
		if missing := missingEnv(env, ncclSafeEnv); len(missing) > 0 {
			p, _ := proctree.Read(pid)
			return &Finding{pid, p.Command,
				"is one of several GPU processes using NCCL with its P2P/SHM transports, whose shared GPU memory the CUDA driver cannot restore",
				"start the job with " + strings.Join(ncclSafeEnv, " ") + " (gpucr run -- CMD does this)"}
		}
	}
	return nil
}

func holdsIOURing(pid int) (bool, error) {
	files, err := proctree.OpenFiles("/proc", pid)
	return slices.Contains(files, "anon_inode:[io_uring]"), err
}

func mapsLibrary(pid int, name string) (bool, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "maps"))
	if err != nil {
		return false, err
	}
	return bytes.Contains(b, []byte("/"+name)), nil
}

// missingEnv returns the settings of want that the NUL-separated environment env lacks.
func missingEnv(env []byte, want []string) []string {
	have := map[string]bool{}
	for _, kv := range bytes.Split(env, []byte{0}) {
		have[string(kv)] = true
	}
	var out []string
	for _, w := range want {
		if !have[w] {
			out = append(out, w)
		}
	}
	return out
}
