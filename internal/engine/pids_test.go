package engine

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/image"
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

	err := waitPIDsFree(m, 200*time.Millisecond)
	if !errors.Is(err, ErrPIDInUse) || !strings.Contains(err.Error(), "process group ID of") || !strings.Contains(err.Error(), "sleep") {
		t.Fatalf("with the group still alive: %v, want ErrPIDInUse naming the group's sleep", err)
	}
	start := time.Now()
	if err := waitPIDsFree(m, 10*time.Second); err != nil {
		t.Fatalf("waiting for the group to go: %v", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("waited %v for a group that ends within 1.5 s", waited)
	}
}
