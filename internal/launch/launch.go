// Package launch starts a GPU job so that gpucr can checkpoint it later: each rank gets the
// env:// rendezvous variables torch.distributed reads, NCCL talks over sockets only, and
// nothing in the tree uses io_uring (which CRIU cannot checkpoint).
package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gpucr/gpucr/internal/safety"
)

// Job is a command to run as NProc ranks on this host.
type Job struct {
	NProc   int
	Command []string
	Stdout  io.Writer
	Stderr  io.Writer
}

// CheckpointableEnv is what every rank gets on top of gpucr's own environment: NCCL over
// sockets, and torch's TCPStore without libuv.
func CheckpointableEnv() []string {
	return append(safety.NCCLSafeEnv(), "USE_LIBUV=0")
}

// Run starts the ranks, forwards SIGINT and SIGTERM to them, and waits. When a rank fails
// the others are stopped, as torchrun does. It returns the first non-zero exit code.
func Run(ctx context.Context, j Job) (int, error) {
	if j.NProc < 1 || len(j.Command) == 0 {
		return 0, errors.New("launch: need a command and at least one process")
	}
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	base := append(os.Environ(), CheckpointableEnv()...)
	base = append(base, "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
		"WORLD_SIZE="+strconv.Itoa(j.NProc), "LOCAL_WORLD_SIZE="+strconv.Itoa(j.NProc))
	cmds := make([]*exec.Cmd, j.NProc)
	for i := range cmds {
		c := exec.CommandContext(ctx, j.Command[0], j.Command[1:]...)
		c.Env = append(append([]string(nil), base...), "RANK="+strconv.Itoa(i), "LOCAL_RANK="+strconv.Itoa(i))
		c.Stdin, c.Stdout, c.Stderr = nil, j.Stdout, j.Stderr
		if err := c.Start(); err != nil {
			stopAll(cmds[:i])
			return 0, fmt.Errorf("launch rank %d: %w", i, err)
		}
		cmds[i] = c
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for s := range sigs {
			for _, c := range cmds {
				_ = c.Process.Signal(s)
			}
		}
	}()

	codes := make([]int, len(cmds))
	var once sync.Once
	var wg sync.WaitGroup
	for i, c := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Wait()
			codes[i] = c.ProcessState.ExitCode()
			if err != nil {
				once.Do(func() { stopAll(cmds) })
			}
		}()
	}
	wg.Wait()
	for _, code := range codes {
		if code != 0 {
			return code, nil
		}
	}
	return 0, nil
}

// stopGrace is how long a rank told to stop has before it is killed, as torchrun gives: a
// rank hung in a collective, or one that ignores SIGTERM, would otherwise hold the launcher
// (and the job's exit) for good. A variable: tests shorten it.
var stopGrace = 30 * time.Second

// stopAll tells the ranks to stop, and kills those still running stopGrace later.
func stopAll(cmds []*exec.Cmd) {
	signalAll(cmds, syscall.SIGTERM)
	time.AfterFunc(stopGrace, func() { signalAll(cmds, syscall.SIGKILL) })
}

// signalAll sends sig to every rank started; one that has exited ignores it.
func signalAll(cmds []*exec.Cmd, sig syscall.Signal) {
	for _, c := range cmds {
		if c != nil && c.Process != nil {
			_ = c.Process.Signal(sig)
		}
	}
}

// freePort asks the kernel for a loopback port the ranks can rendezvous on.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("launch: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
