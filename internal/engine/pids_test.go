package engine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/proctree"
)

// A checkpointed tree's PID can stay taken after its process is gone: as the process group
// of a child that is still exiting. Restore waits for it, and names the holder if it stays.
func TestRestoreWaitsForAPIDHeldAsAProcessGroup(t *testing.T) {
	// The leader starts a child in its group and exits; the child holds the group's ID.
	leader := exec.Command("sh", "-c", "sleep 1.5 & exit 0")
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := leader.Run(); err != nil {
		t.Fatal(err)
	}
	pgid := leader.Process.Pid
	m := &image.Manifest{Processes: []image.Process{{PID: pgid, Command: "worker"}}}

	err := waitPIDsFree(m, nil, 200*time.Millisecond)
	if !errors.Is(err, ErrPIDInUse) || !strings.Contains(err.Error(), "process group ID of") || !strings.Contains(err.Error(), "sleep") {
		t.Fatalf("with the group still alive: %v, want ErrPIDInUse naming the group's sleep", err)
	}
	start := time.Now()
	if err := waitPIDsFree(m, nil, 10*time.Second); err != nil {
		t.Fatalf("waiting for the group to go: %v", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("waited %v for a group that ends within 1.5 s", waited)
	}
}

// A thread ID of the image that a thread here holds is named before CRIU starts: CRIU
// created the processes and then failed with "Unable to create a thread: -17" (found by a
// hostile test). Here the holder is one of this test's own threads.
func TestRestoreNamesATakenThreadID(t *testing.T) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	tid := 0
	for _, e := range tasks {
		if n, _ := strconv.Atoi(e.Name()); n != os.Getpid() {
			tid = n
			break
		}
	}
	if tid == 0 {
		t.Fatal("the test process has one thread")
	}
	const pid = 1 << 22 // above any PID the kernel hands out: free
	m := &image.Manifest{Processes: []image.Process{{PID: pid, Command: "worker"}}}
	err = waitPIDsFree(m, map[int]int{tid: pid}, time.Second)
	want := fmt.Sprintf("thread %d of PID %d (worker in the image) is held by", tid, pid)
	if !errors.Is(err, ErrPIDInUse) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), fmt.Sprintf("(PID %d)", os.Getpid())) {
		t.Fatalf("restore with a thread ID taken: %v, want ErrPIDInUse with %q naming this process", err, want)
	}
	if err := waitPIDsFree(m, map[int]int{pid + 1: pid}, time.Second); err != nil {
		t.Fatalf("restore with its thread IDs free: %v", err)
	}
}

// CRIU seizes the root by PID alone: one that exited while its GPUs were locked and had its
// PID taken by another process would have that process dumped under its image. Once CRIU
// holds the tree, the root must still be the process read at Open, or the dump fails before
// anything is copied out of it.
func TestSeizedTreeMustBeTheOneRead(t *testing.T) {
	self, err := proctree.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		start  uint64
		frozen bool
	}{{self.Start, true}, {self.Start + 1, false}} {
		p := &processTree{pid: self.PID, tree: []proctree.Process{{PID: self.PID, Start: tc.start}}}
		frozen := false
		err := dumpNotify{h: DumpHooks{Frozen: func() { frozen = true }}, same: p.same}.Seized()
		if frozen != tc.frozen || (err == nil) != tc.frozen || err != nil && !errors.Is(err, ErrBadTarget) {
			t.Errorf("root started at %d, read as %d: Seized = %v, frozen %v", self.Start, tc.start, err, frozen)
		}
	}
}
