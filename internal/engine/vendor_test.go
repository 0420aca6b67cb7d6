package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/gpu"
)

// A process holding a device file of a vendor whose backend is off here cannot be dumped
// (CRIU cannot save the device's state): the checkpoint refuses before touching anything,
// naming the process, the file, the vendor and why it is off; the process runs on.
func TestTreeOnAnOffVendorsGPUIsRefused(t *testing.T) {
	e := newEngine(t, &fakeGPU{})
	// The sleeper's stdin is /dev/null: let it stand for a GPU device file.
	e.Off = []gpu.Off{{Vendor: gpu.Vendor{Name: "acme", DeviceFiles: []string{"/dev/nul?"}}, Reason: errors.New("no acme driver")}}
	pid := startSleeper(t)
	dir := filepath.Join(t.TempDir(), "img")
	_, err := e.Checkpoint(context.Background(), e.Tree(pid), CheckpointRequest{Dir: dir, LockTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "holds /dev/null, and the acme GPU backend is off on this host: no acme driver") {
		t.Fatalf("checkpoint = %v, want a refusal naming /dev/null, acme and the reason", err)
	}
	if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("refused checkpoint left %s", dir)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("the process is gone after a refused checkpoint: %v", err)
	}
}
