//go:build gpu

// Tests against a real NVIDIA driver, for the device machine: go test -tags gpu, as root,
// with python3 and torch installed.
package nvidia

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/proctree"
)

// holderScript keeps 512 MiB of known data on a GPU and, for each line on stdin, answers
// whether the data is intact after running a fresh kernel over it.
const holderScript = `
import os, sys, torch
x = torch.arange(1 << 26, dtype=torch.int64, device="cuda")
want = int(x.sum())
torch.cuda.synchronize()
print(os.getpid(), flush=True)
for _ in sys.stdin:
    print(int((x * 1).sum()) == want, flush=True)
`

// holder is a CUDA process under test.
type holder struct {
	pid int
	in  io.WriteCloser
	out *bufio.Scanner
}

// startHolder starts a holder with env added to the test's environment.
func startHolder(t *testing.T, env ...string) *holder {
	t.Helper()
	cmd := exec.Command("python3", "-c", holderScript)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start holder: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	h := &holder{in: in, out: bufio.NewScanner(out)}
	if !h.out.Scan() {
		t.Fatalf("holder did not start: %v", h.out.Err())
	}
	if h.pid, err = strconv.Atoi(h.out.Text()); err != nil {
		t.Fatalf("holder said %q, want its pid", h.out.Text())
	}
	return h
}

// intact asks the holder to check its data on the GPU.
func (h *holder) intact(t *testing.T) bool {
	t.Helper()
	if _, err := io.WriteString(h.in, "check\n"); err != nil {
		t.Fatal(err)
	}
	if !h.out.Scan() {
		t.Fatalf("holder did not answer: %v", h.out.Err())
	}
	return h.out.Text() == "True"
}

func openDevice(t *testing.T) (*Backend, gpu.Host) {
	t.Helper()
	b, err := Open(gpu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := b.Host(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range h.Devices {
		if d.Properties.Uint(propL2) == 0 || d.Properties[propCompute] == "" || d.MemoryTotal == 0 {
			t.Errorf("device %+v lacks properties", d)
		}
	}
	t.Logf("host: %+v", h)
	return b.(*Backend), h
}

// devicesOf says on which GPUs NVML sees pid.
func devicesOf(t *testing.T, b *Backend, pid int) []string {
	t.Helper()
	procs, err := b.Processes(context.Background(), proctree.Snap("/proc", []proctree.Process{{PID: pid}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) == 0 {
		return nil
	}
	return procs[0].Devices
}

func wantState(t *testing.T, b *Backend, pid int, want gpu.State) {
	t.Helper()
	if st, err := b.State(context.Background(), pid); err != nil || st != want {
		t.Fatalf("State = %v, %v; want %v", st, err, want)
	}
}

// cycle locks and checkpoints pid, then restores it with remap and unlocks it.
func cycle(t *testing.T, b *Backend, pid int, remap map[string]string) {
	t.Helper()
	ctx := context.Background()
	if err := b.Lock(ctx, pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	wantState(t, b, pid, gpu.StateLocked)
	if err := b.Checkpoint(ctx, pid); err != nil {
		t.Fatal(err)
	}
	wantState(t, b, pid, gpu.StateCheckpointed)
	if err := b.Restore(ctx, pid, remap); err != nil {
		t.Fatal(err)
	}
	wantState(t, b, pid, gpu.StateLocked)
	if err := b.Unlock(ctx, pid); err != nil {
		t.Fatal(err)
	}
	wantState(t, b, pid, gpu.StateRunning)
}

func TestDeviceCheckpointRestore(t *testing.T) {
	b, h := openDevice(t)
	p := startHolder(t)
	if got := devicesOf(t, b, p.pid); len(got) != 1 || got[0] != h.Devices[0].UUID {
		t.Fatalf("holder runs on %v, want GPU 0 (%s)", got, h.Devices[0].UUID)
	}
	cycle(t, b, p.pid, nil)
	if !p.intact(t) {
		t.Fatal("data changed across checkpoint and restore")
	}
}

func TestDeviceRestoreOntoAnotherGPU(t *testing.T) {
	b, h := openDevice(t)
	if len(h.Devices) < 2 {
		t.Skip("needs two GPUs")
	}
	g0, g1 := h.Devices[0].UUID, h.Devices[1].UUID
	for name, env := range map[string][]string{
		"sees every GPU": nil,
		"sees GPU 0":     {"CUDA_VISIBLE_DEVICES=" + g0},
	} {
		t.Run(name, func(t *testing.T) {
			p := startHolder(t, env...)
			cycle(t, b, p.pid, map[string]string{g0: g1})
			if !p.intact(t) {
				t.Fatal("data changed across checkpoint and restore")
			}
			if got := devicesOf(t, b, p.pid); strings.Join(got, ",") != g1 {
				t.Fatalf("restored holder runs on %v, want GPU 1 (%s)", got, g1)
			}
		})
	}
}
