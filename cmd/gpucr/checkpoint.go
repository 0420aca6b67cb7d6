package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/interrupt"
)

// criuFlags binds the CRIU options that checkpoint and restore share.
func criuFlags(cmd *cobra.Command, o *criu.Options) {
	f := cmd.Flags()
	f.BoolVarP(&o.ShellJob, "shell-job", "j", false, "the tree is attached to a terminal (a shell job)")
	f.BoolVar(&o.TCPEstablished, "tcp-established", false, "checkpoint and restore established TCP connections")
	f.BoolVar(&o.ExtUnixSk, "ext-unix-sk", false, "allow unix sockets connected to processes outside the tree")
	f.BoolVar(&o.FileLocks, "file-locks", false, "checkpoint and restore file locks")
	f.IntVar(&o.LogLevel, "criu-log-level", criu.DefaultLogLevel, "CRIU's log verbosity, 1-4 (4 to debug a failure)")
	f.StringVar(&o.NetworkLock, "network-lock", "", `how CRIU blocks TCP traffic while frozen: iptables (default), nftables, or skip when all peers are in the tree`)
}

// checkpointOutput is the summary of a checkpoint, for text and JSON alike.
type checkpointOutput struct {
	Dir          string      `json:"dir"`
	Container    string      `json:"container,omitempty"`
	RootPID      int         `json:"rootPid"`
	Processes    int         `json:"processes"`
	MemoryBytes  uint64      `json:"memoryBytes"`
	GPUProcesses int         `json:"gpuProcesses"`
	GPUBytes     uint64      `json:"gpuMemoryBytes"`
	LeftRunning  bool        `json:"leftRunning"`
	Phases       []phaseJSON `json:"phases"`
	Total        float64     `json:"totalSeconds"`
	// Pushed is the upload of --to: the image is written to DIR first, then stored there.
	Pushed *transferOutput `json:"pushed,omitempty"`
}

func (a *app) checkpointCmd() *cobra.Command {
	var r engine.CheckpointRequest
	var to string
	var ctr string
	var rf runcFlags
	cmd := &cobra.Command{
		Use:   "checkpoint {PID | --container ID} -D DIR",
		Short: "Checkpoint a running process tree or runc container (and its GPU state) to an image directory",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if ctr != "" {
				if len(args) > 0 {
					return usageError{fmt.Errorf("give either a PID or --container ID, not both")}
				}
				if to != "" {
					return usageError{fmt.Errorf("--to is for process trees; store a container image with gpucr push")}
				}
				return a.checkpointContainer(cmd, rf, container.CheckpointRequest{
					ID: ctr, Dir: r.Dir, LeaveRunning: r.LeaveRunning, LockTimeout: r.LockTimeout,
				}, r.Options)
			}
			if len(args) == 0 {
				return usageError{fmt.Errorf("give the PID of the tree to checkpoint, or --container ID")}
			}
			pid, err := strconv.Atoi(args[0])
			if err != nil {
				return usageError{fmt.Errorf("PID %q is not a number", args[0])}
			}
			r.PID = pid
			start := time.Now()
			var m *image.Manifest
			err = a.withEngine(cmd, r.Options, func(ctx context.Context, e *engine.Engine) (err error) {
				m, err = e.Checkpoint(ctx, r)
				return err
			})
			if err != nil {
				return err
			}
			out := checkpointOutput{
				Dir: r.Dir, RootPID: m.RootPID, Processes: len(m.Processes), MemoryBytes: m.MemoryBytes,
				LeftRunning: r.LeaveRunning, Phases: phasesJSON(m.Phases), Total: time.Since(start).Seconds(),
			}
			for _, s := range m.GPUs {
				for _, p := range s.Processes {
					out.GPUProcesses++
					out.GPUBytes += p.MemoryBytes
				}
			}
			if to != "" {
				ctx, stop := interrupt.Context(cmd.Context())
				defer stop()
				pushed, err := a.push(ctx, r.Dir, to)
				if err != nil {
					return fmt.Errorf("checkpoint written to %s, but storing it failed (retry with gpucr push): %w", r.Dir, err)
				}
				out.Pushed = &pushed
			}
			return a.emit(out, func() {
				printCheckpoint(a, out, m.Phases)
				if out.Pushed != nil {
					printPush(a, *out.Pushed)
				}
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&r.Dir, "images-dir", "D", "", "image directory to create (must not exist or be empty)")
	f.StringVar(&to, "to", "", "then store the image at s3://BUCKET/PREFIX or a local store PATH (as gpucr push)")
	f.BoolVarP(&r.LeaveRunning, "leave-running", "R", false, "leave the process tree running after the checkpoint")
	f.DurationVar(&r.LockTimeout, "lock-timeout", 10*time.Second, "how long to wait for GPU work in flight before giving up")
	f.StringVar(&ctr, "container", "", "checkpoint the runc container with this ID instead of a PID's tree")
	rf.bind(cmd)
	criuFlags(cmd, &r.Options)
	_ = cmd.MarkFlagRequired("images-dir")
	return cmd
}

func printCheckpoint(a *app, out checkpointOutput, phases []image.Phase) {
	if out.Container != "" {
		fmt.Fprintf(a.stdout, "checkpointed container %s (%d processes) to %s in %.2fs\n", out.Container, out.Processes, out.Dir, out.Total)
	} else {
		fmt.Fprintf(a.stdout, "checkpointed PID %d (%d processes) to %s in %.2fs\n", out.RootPID, out.Processes, out.Dir, out.Total)
	}
	fmt.Fprintf(a.stdout, "  memory  %s written\n", bytesHuman(out.MemoryBytes))
	if out.GPUProcesses > 0 {
		fmt.Fprintf(a.stdout, "  gpu     %d process(es), %s of GPU memory\n", out.GPUProcesses, bytesHuman(out.GPUBytes))
	}
	fmt.Fprintf(a.stdout, "  phases  %s\n", phasesLine(phases))
	switch {
	case out.LeftRunning && out.Container != "":
		fmt.Fprintln(a.stdout, "  the container was left running")
	case out.LeftRunning:
		fmt.Fprintln(a.stdout, "  the process tree was left running")
	}
}
