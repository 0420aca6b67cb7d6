package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/launch"
)

func (a *app) runCmd() *cobra.Command {
	var nproc int
	cmd := &cobra.Command{
		Use:   "run [--nproc-per-node N] -- CMD [ARG...]",
		Short: "Start a (multi-process) GPU job so that it can be checkpointed",
		Example: examples(
			"gpucr run -- python train.py # checkpoint it by gpucr run's PID",
			"gpucr run --nproc-per-node 8 -- python train.py --epochs 3 # eight ranks, in place of torchrun",
		),
		Long: `Starts CMD as N ranks with the env:// variables torch.distributed reads (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), in place of torchrun, whose agent uses io_uring that
CRIU cannot checkpoint. Every rank runs with ` + strings.Join(launch.CheckpointableEnv(), " ") + `:
NCCL moves data between ranks over sockets, because the CUDA driver cannot restore GPU or
pinned memory shared between processes. Collectives between GPUs of one host are then
slower than over NVLink; single-GPU work is unaffected.
Checkpoint the whole job by the PID of gpucr run, with --tcp-established.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if a.json {
				// The ranks write to gpucr's stdout themselves: no document could be the
				// only thing there, and a machine reading one got nothing (hostile test).
				return usageError{errors.New("run passes the job's own output through: --json is not for it; the exit status is the job's")}
			}
			if nproc < 1 {
				return usageError{fmt.Errorf("--nproc-per-node %d: a job has at least one rank", nproc)}
			}
			// A program that cannot be started is the request's mistake, said as one: it was
			// "launch rank 0: fork/exec PATH: ..." with the code of a failed job (doc walk).
			if _, err := exec.LookPath(args[0]); err != nil {
				why := errors.Unwrap(err)
				if pe, ok := errors.AsType[*fs.PathError](why); ok {
					why = pe.Err
				}
				return usageError{fmt.Errorf("cannot run %s: %w", args[0], why)}
			}
			return launch.Run(cmd.Context(), launch.Job{NProc: nproc, Command: args, Stdout: a.stdout, Stderr: a.stderr})
		},
	}
	cmd.Flags().IntVar(&nproc, "nproc-per-node", 1, "how many ranks to start")
	return cmd
}

// jobExitCode returns a launched job's own exit status, if err carries one: gpucr run
// exits with it, as torchrun does.
func jobExitCode(err error) (int, bool) {
	var e *launch.RankError
	if errors.As(err, &e) {
		return e.ExitCode(), true
	}
	return 0, false
}
