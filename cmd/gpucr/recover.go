package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/guardian"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/txn"
)

// recoverOutput is what `gpucr recover` did, for text and JSON alike.
type recoverOutput struct {
	Recovered []txn.Record `json:"recovered"`
	Resumed   []int        `json:"resumedGpuProcesses,omitempty"`
	// Error and ExitCode say what failed, as every verb's error document does: what was
	// recovered is reported in the same document.
	Error    string `json:"error,omitempty"`
	ExitCode int    `json:"exitCode,omitempty"`
}

func (a *app) recoverCmd() *cobra.Command {
	var pids []int
	cmd := &cobra.Command{
		Use:   "recover [--pid PID]...",
		Short: "Finish the rollback of operations whose gpucr died, and bring stranded GPU processes back",
		Example: examples(
			"gpucr recover # finish what a gpucr that died left (the next verb would too)",
			"gpucr recover --pid 4242 # bring back a process stranded on its GPU (see gpucr check)",
		),
		Long: "gpucr journals each checkpoint and restore under " + txn.DefaultRoot + "; a guardian rolls one back at once\n" +
			"if gpucr dies. recover does it for operations whose guardian died too (every verb does it first).\n" +
			"--pid brings a process that `gpucr check` lists as stranded on its GPU back to running.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, err := a.recoveryEngine()
			if err != nil {
				return classify(err)
			}
			recovered, rerr := e.RecoverStale()
			out := recoverOutput{Recovered: append([]txn.Record{}, recovered...)}
			for _, pid := range pids {
				if err := resumeStranded(cmd.Context(), e, pid); err != nil {
					rerr = errors.Join(rerr, err)
					continue
				}
				out.Resumed = append(out.Resumed, pid)
			}
			if rerr != nil {
				out.Error, out.ExitCode = printable(oneLine(rerr)), exitCode(rerr)
			}
			if err := a.emit(out, func() { printRecover(a, out) }); err != nil {
				return err
			}
			if rerr != nil {
				return inOutput{rerr}
			}
			return nil
		},
	}
	cmd.Flags().IntSliceVar(&pids, "pid", nil, "a process stranded on its GPU (locked or checkpointed) to restore and unlock")
	return cmd
}

func printRecover(a *app, out recoverOutput) {
	if len(out.Recovered) == 0 && len(out.Resumed) == 0 && out.Error == "" {
		fmt.Fprintln(a.stdout, "nothing to recover")
	}
	for _, r := range out.Recovered {
		if r.Op == txn.OpStaging && r.Image != "" && r.Committed {
			fmt.Fprintf(a.stdout, "kept the complete checkpoint at %s: gpucr PID %d died before its %s was whole; restore it with %s\n",
				printable(r.Image), r.Owner.PID, printable(r.Target), printable(keptExportRestore(r.Image)))
			continue
		}
		if r.Op == txn.OpCheckpoint && r.Committed {
			fmt.Fprintf(a.stdout, "finished the %s of %s: its image was complete when gpucr PID %d died in %s; what still ran of it runs on\n", r.Op, printable(r.Target), r.Owner.PID, printable(r.Phase))
			continue
		}
		fmt.Fprintf(a.stdout, "rolled back the %s of %s (gpucr PID %d died in %s)\n", r.Op, printable(r.Target), r.Owner.PID, printable(r.Phase))
		if r.Stored != "" && r.Phase == engine.PhaseCommit {
			// The store's side of the commit is its manifest, which gpucr may have written.
			fmt.Fprintf(a.stdout, "  it died while storing its manifest: the checkpoint at %s is complete if `gpucr ls` lists it\n", printable(r.Stored))
		}
	}
	for _, pid := range out.Resumed {
		fmt.Fprintf(a.stdout, "PID %d runs on its GPU again\n", pid)
	}
}

// keptExportRestore is the command that restores the image a killed export kept at dir,
// the container's ID read from it. The advice named no ID, and the container may run still,
// its checkpoint rolled back before runc removed it: a user following it was refused, or
// removed the running container to restore an older copy (crash test).
func keptExportRestore(dir string) string {
	id := "ID"
	if info, err := container.ReadInfo(dir); err == nil && info.ID != "" {
		id = engine.ShellWord(info.ID)
	}
	return fmt.Sprintf("gpucr restore --container %s -D %s, with --new-id NEWID while container %s runs", id, engine.ShellWord(dir), id)
}

// resumeStranded restores and unlocks one process's device state, whichever backend holds
// it, under the process's lock: a process a live checkpoint has locked or checkpointed is
// that checkpoint's, and was restored and unlocked under it (review).
func resumeStranded(ctx context.Context, e *engine.Engine, pid int) error {
	if _, err := proctree.Read(pid); err != nil {
		return classify(err) // "not stranded" said nothing of a PID that is gone (doc walk)
	}
	if e.JournalRoot != "" {
		l, err := txn.LockTarget(e.JournalRoot, engine.PIDLock(pid), fmt.Sprintf("gpucr PID %d is recovering PID %d", os.Getpid(), pid))
		if errors.Is(err, txn.ErrBusy) {
			return usageError{fmt.Errorf("PID %d: %w: its GPU state is that operation's, not stranded", pid, err)}
		}
		if err != nil {
			return err
		}
		defer l.Release()
		// A restore holds its processes by its record, not by their PIDs' locks (a
		// container's are known only once CRIU made them): one of them sits checkpointed on
		// its GPU until the restore resumes it (review).
		en, err := txn.HoldingGPU(e.JournalRoot, pid)
		if err != nil {
			return err
		}
		if en != nil {
			return usageError{fmt.Errorf("PID %d: %w: the %s of %s holds it, its GPU state is that operation's, not stranded", pid, txn.ErrBusy, en.Op, printable(en.Target))}
		}
	}
	procs, err := stranded(ctx, e.Backends, []int{pid})
	if err != nil {
		return err
	}
	if len(procs) == 0 {
		return usageError{fmt.Errorf("PID %d is not stranded on a GPU (not locked or checkpointed)", pid)}
	}
	if err := procs.Resume(ctx, nil); err != nil {
		return fmt.Errorf("resume PID %d: %w", pid, err)
	}
	return nil
}

// stranded finds those of pids whose device state is locked or checkpointed.
func stranded(ctx context.Context, backends []gpu.Backend, pids []int) (engine.GPUSet, error) {
	procs := make([]proctree.Process, len(pids))
	for i, pid := range pids {
		procs[i] = proctree.Process{PID: pid}
	}
	found, err := engine.FindGPUProcs(ctx, backends, nil, proctree.Snap("/proc", procs))
	if err != nil {
		return nil, err
	}
	var out engine.GPUSet
	for _, p := range found.GPUs {
		if st, err := p.Backend.State(ctx, p.PID); err == nil && st != gpu.StateRunning {
			out = append(out, p)
		}
	}
	return out, nil
}

// guardCmd is the guardian gpucr starts beside each operation (package guardian): it
// waits for gpucr to end the operation, and rolls it back if gpucr dies first.
func (a *app) guardCmd() *cobra.Command {
	var id string
	cmd := &cobra.Command{
		Use:    "guard --id ID",
		Short:  "Watch one gpucr operation and roll it back if gpucr dies (started by gpucr itself)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			watch := os.NewFile(guardian.WatchFD, "watch")
			lock := os.NewFile(guardian.JournalFD, "journal-lock")
			if watch == nil || lock == nil {
				return usageError{errors.New("gpucr guard is started by gpucr itself")}
			}
			if !guardian.Watch(watch) {
				return nil
			}
			e, err := a.recoveryEngine()
			if err != nil {
				return err
			}
			logf, err := os.OpenFile(filepath.Join(e.JournalRoot, "recovery.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
			if err == nil {
				defer logf.Close()
				e.Log = slog.New(slog.NewTextHandler(logf, nil))
			}
			j, err := txn.Adopt(e.JournalRoot, id, lock)
			if errors.Is(err, os.ErrNotExist) {
				return nil // gpucr died after it ended the operation
			}
			if err != nil {
				e.Logger().Error("guardian", "err", err)
				return err
			}
			err = e.Recover(context.Background(), j)
			for i, name := range j.Record().Locks {
				if f := os.NewFile(uintptr(guardian.FirstLockFD+i), name); f != nil {
					txn.AdoptLock(e.JournalRoot, name, f).Release()
				}
			}
			return err
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "the journal record to guard")
	return cmd
}

// recoveryEngine is an engine for rolling back: the GPU backends and the journal, and
// CRIU where it is found (rollback itself never runs CRIU).
func (a *app) recoveryEngine() (*engine.Engine, error) {
	if os.Geteuid() != 0 {
		return nil, engine.ErrNotRoot
	}
	backends, _ := gpu.Probe(a.gpuConfig(a.criuBinary()))
	return &engine.Engine{Backends: backends, Version: version, Log: a.log, JournalRoot: a.runDir}, nil
}
