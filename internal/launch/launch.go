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
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/proctree"
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

// RankError is the rank that failed first: its exit code, or the signal that killed it.
type RankError struct {
	Rank   int
	Code   int
	Signal syscall.Signal
}

func (e *RankError) Error() string {
	if e.Signal != 0 {
		return fmt.Sprintf("rank %d was killed by %s (signal %d)", e.Rank, unix.SignalName(e.Signal), int(e.Signal))
	}
	return fmt.Sprintf("rank %d exited with code %d", e.Rank, e.Code)
}

// ExitCode is the job's exit status: the failed rank's, or 128 + the signal that killed
// it, as a shell gives.
func (e *RankError) ExitCode() int {
	if e.Signal != 0 {
		return 128 + int(e.Signal)
	}
	return e.Code
}

// forwarded are the signals that would end the launcher and that it passes to the ranks
// instead: each rank decides what they mean, and none outlives the launcher unasked (a
// review's SIGHUP killed the launcher and left its ranks running on their GPUs).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// Run starts the ranks, forwards the signals that would end it to them, and waits. When a
// rank fails the others are stopped, as torchrun does; the rank that failed first is
// returned as a *RankError (the ranks stopped after it do not hide it). A rank is killed
// when the launcher dies (SIGKILL, an OOM kill): a job is the launcher and its ranks.
func Run(ctx context.Context, j Job) error {
	if j.NProc < 1 || len(j.Command) == 0 {
		return errors.New("launch: need a command and at least one process")
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	base := append(os.Environ(), CheckpointableEnv()...)
	base = append(base, "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
		"WORLD_SIZE="+strconv.Itoa(j.NProc), "LOCAL_WORLD_SIZE="+strconv.Itoa(j.NProc))
	// Caught from before the first rank starts: one that came in between would end the
	// launcher and leave the ranks started so far behind.
	// A signal ignored when gpucr started (nohup's SIGHUP) stays ignored, for the ranks too:
	// caught, it would be reset to its default in every rank gpucr starts.
	var caught []os.Signal
	for _, sig := range forwarded {
		if !signal.Ignored(sig) {
			caught = append(caught, sig)
		}
	}
	sigs := make(chan os.Signal, len(forwarded))
	signal.Notify(sigs, caught...)
	defer signal.Stop(sigs)
	// The ranks' death signal follows the thread that started them: it is kept for as long
	// as the job runs.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmds := make([]*exec.Cmd, j.NProc)
	for i := range cmds {
		c := exec.CommandContext(ctx, j.Command[0], j.Command[1:]...)
		c.Env = append(append([]string(nil), base...), "RANK="+strconv.Itoa(i), "LOCAL_RANK="+strconv.Itoa(i))
		c.Stdin, c.Stdout, c.Stderr = nil, j.Stdout, j.Stderr
		// A process group of its own, which every signal to the rank goes to: a rank that
		// is a wrapper script, or that has workers, stops with all it started (its children
		// outlived the job; hostile test).
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if err := startRank(c); err != nil {
			// The job never ran: the ranks started go at once, none left behind.
			signalAll(cmds[:i], nil, syscall.SIGKILL)
			for _, c := range cmds[:i] {
				_ = c.Wait()
			}
			return fmt.Errorf("launch rank %d: %w", i, err)
		}
		cmds[i] = c
	}
	reaped := make([]atomic.Bool, len(cmds))
	go func() {
		for s := range sigs {
			signalAll(cmds, reaped, s.(syscall.Signal))
		}
	}()

	var first *RankError
	var once sync.Once
	var wg sync.WaitGroup
	for i, c := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Wait()
			reaped[i].Store(true)
			if err == nil {
				return
			}
			once.Do(func() {
				first = &RankError{Rank: i, Code: c.ProcessState.ExitCode()}
				if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					first.Signal = ws.Signal()
				}
				stopAll(cmds, reaped)
			})
		}()
	}
	wg.Wait()
	if first == nil {
		// Every rank ended well: what they started in their groups goes with the job, as
		// it does with a failed one (workers left running after a successful job, holding
		// their GPUs; hostile test).
		stopAll(cmds, reaped)
	}
	drain(cmds, reaped)
	if first != nil {
		return first
	}
	return nil
}

// drain waits, stopGrace at most, for what the reaped ranks left in their groups to go once
// told to stop, and kills what is still there: the SIGKILL stopAll's timer sends never came
// once the launcher had exited, and a worker that ignores SIGTERM outlived the job (review).
func drain(cmds []*exec.Cmd, reaped []atomic.Bool) {
	left := func() bool {
		groups := orphanedGroups()
		return slices.ContainsFunc(cmds, func(c *exec.Cmd) bool { return c != nil && c.Process != nil && groups[c.Process.Pid] })
	}
	for deadline := time.Now().Add(stopGrace); left(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			signalAll(cmds, reaped, syscall.SIGKILL)
			return
		}
	}
}

// startRank starts one rank. A variable: tests fail it for a rank.
var startRank = (*exec.Cmd).Start

// stopGrace is how long a rank told to stop has before it is killed, as torchrun gives: a
// rank hung in a collective, or one that ignores SIGTERM, would otherwise hold the launcher
// (and the job's exit) for good. A variable: tests shorten it.
var stopGrace = 30 * time.Second

// stopAll tells the ranks to stop, and kills those still running stopGrace later.
func stopAll(cmds []*exec.Cmd, reaped []atomic.Bool) {
	signalAll(cmds, reaped, syscall.SIGTERM)
	time.AfterFunc(stopGrace, func() { signalAll(cmds, reaped, syscall.SIGKILL) })
}

// signalAll sends sig to the process group of every rank started: the rank and what it
// started. The group of a rank already reaped (reaped[i]) is its own only while processes
// it started live on in it and no process has the rank's PID: an emptied group's number is
// free, and a process given it as its PID that leads a group of its own got the job's
// signals (hostile test: another user's process killed by root's SIGTERM). While a member
// lives, the kernel gives no one that number.
func signalAll(cmds []*exec.Cmd, reaped []atomic.Bool, sig syscall.Signal) {
	var orphaned map[int]bool // read once, if a rank was reaped
	for i, c := range cmds {
		if c == nil || c.Process == nil {
			continue
		}
		group := c.Process.Pid
		if reaped != nil && reaped[i].Load() {
			if orphaned == nil {
				orphaned = orphanedGroups()
			}
			if !orphaned[group] {
				continue
			}
		}
		_ = syscall.Kill(-group, sig)
	}
}

// orphanedGroups lists the process groups that have processes in them but not their
// leader: a reaped rank's, where what it started lives on.
func orphanedGroups() map[int]bool {
	all, _ := proctree.All() // a scan that failed names no group: reaped ranks' go unsignalled
	pids := make(map[int]bool, len(all))
	for _, p := range all {
		pids[p.PID] = true
	}
	out := map[int]bool{}
	for _, p := range all {
		if !pids[p.Pgrp] {
			out[p.Pgrp] = true
		}
	}
	return out
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
