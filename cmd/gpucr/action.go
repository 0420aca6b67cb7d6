package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/txn"
)

// criuActionCmd is what the CRIU integration's action script starts (hidden: CRIU runs it,
// people do not). With --rollback-after it is instead the watcher that pre-dump starts.
func (a *app) criuActionCmd() *cobra.Command {
	var logPath, stateDir, heldPath, work, owner string
	var lockTimeout time.Duration
	var criuPID, heldLocks int
	cmd := &cobra.Command{
		Use:    "criu-action",
		Short:  "CRIU action that moves GPU state during runc and crun checkpoint and restore",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, closeLog := actionLog(logPath, a.stderr)
			defer closeLog()
			log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo}))
			if heldPath != "" {
				defer container.ReleaseInheritedLocks(heldLocks)
				for _, err := range container.LeaveCallersCgroups() {
					log.Warn("rollback watcher: it dies with its caller's cgroup, which may stop its job on its GPUs", "err", err)
				}
				if err := container.WaitCRIU(); err != nil {
					log.Error("rollback watcher", "err", err)
					return err
				}
				backends, _ := gpu.Probe(a.gpuConfig(""))
				if err := container.RollBack(cmd.Context(), backends, heldPath, log); err != nil {
					log.Error("rollback after dump", "err", err)
					return err
				}
				return nil
			}
			if work != "" {
				var o txn.Proc
				if _, err := fmt.Sscanf(owner, "%d:%d", &o.PID, &o.Start); err != nil {
					return fmt.Errorf("--owner %q: want PID:START", owner)
				}
				return container.PostRestore(cmd.Context(), os.Getenv, work, o, log)
			}
			var backends []gpu.Backend
			if os.Getenv(container.ActionSkipEnv) != "skip" { // probing the driver costs time
				backends, _ = gpu.Probe(a.actionGPUConfig())
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find gpucr's own binary: %w", err)
			}
			if criuPID == 0 { // CRIU started gpucr itself
				criuPID = os.Getppid()
			}
			act := &container.Action{
				Backends: backends, Getenv: os.Getenv, CRIUPID: criuPID, StateDir: stateDir,
				LockTimeout: lockTimeout, Version: version, Log: log, RunDir: a.runDir,
				Watch: func(criuPID int, held string, locks []*os.File) error {
					args := []string{"criu-action", "--rollback-after", held, "--locks", strconv.Itoa(len(locks))}
					if logPath != "" {
						args = append(args, "--log", logPath)
					}
					return container.StartWatcher(exe, args, criuPID, locks)
				},
			}
			if err := act.Run(cmd.Context()); err != nil {
				// One line, on the script's stderr (CRIU's log, which runc and crun name; "Error"
				// is what runc quotes from it) and on the engine's, where its user looks first.
				err = actionError{step: os.Getenv("CRTOOLS_SCRIPT_ACTION"), log: logPath, err: err}
				container.TellEngine(act.CRIUPID, engineLine(err))
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&logPath, "log", "", "append a line per step to this file (default: stderr)")
	f.StringVar(&stateDir, "state-dir", container.StateDir, "where one step leaves what a later one needs")
	_ = f.MarkHidden("state-dir")
	f.IntVar(&criuPID, "criu-pid", 0, "the CRIU that runs the action script (default: gpucr's parent)")
	_ = f.MarkHidden("criu-pid")
	f.DurationVar(&lockTimeout, "lock-timeout", 10*time.Second, "how long to wait for GPU work in flight before giving up")
	f.StringVar(&heldPath, "rollback-after", "", "wait for the CRIU on descriptor 3 to exit, then resume the GPU processes listed in this file")
	_ = f.MarkHidden("rollback-after")
	f.IntVar(&heldLocks, "locks", 0, "with --rollback-after: the locks on descriptors 4 on, held until the rollback is done")
	_ = f.MarkHidden("locks")
	f.StringVar(&work, "post-restore", "", "at post-restore, wait for the verdict on the image in this restore work directory and fill the memory it plans (gpucr restore --container)")
	f.StringVar(&owner, "owner", "", "with --post-restore: PID:START of the gpucr that runs the restore")
	_ = f.MarkHidden("post-restore")
	_ = f.MarkHidden("owner")
	return cmd
}

// actionLog opens the action script's log for appending, rotated, falling back to
// stderr: a log that cannot be opened must not fail a checkpoint.
func actionLog(path string, stderr io.Writer) (io.Writer, func()) {
	if path == "" {
		return stderr, func() {}
	}
	f, err := container.OpenLog(path, container.LogMaxBytes, container.LogKept)
	if err != nil {
		return stderr, func() {}
	}
	return f, func() { f.Close() }
}

// actionError is a failed step of the action script, worded for the user of runc, crun or
// the engine above them, who did not call gpucr.
type actionError struct {
	step, log string
	err       error
}

func (e actionError) Error() string {
	where := ""
	if e.log != "" {
		where = "; gpucr's log: " + e.log
	}
	return fmt.Sprintf("Error (CRIU action %s): %v%s", e.step, e.err, where)
}

func (e actionError) Unwrap() error { return e.err }

// installOutput is what install-criu-integration installed.
type installOutput struct {
	Configs []string `json:"configs"` // the CRIU configuration files that name the script
	Script  string   `json:"script"`
	Binary  string   `json:"binary"` // the copy of gpucr the script runs
	Log     string   `json:"log"`
}

// installRuncCmd installs (or removes) the CRIU integration, of crun as well as runc.
func (a *app) installRuncCmd() *cobra.Command {
	var in container.Integration
	var remove bool
	cmd := &cobra.Command{
		Use:     "install-criu-integration",
		Aliases: []string{"install-runc-integration"},
		Short:   "Make plain runc and crun checkpoint/restore (and podman, containerd, CRI-O) move GPU state, through CRIU's runc.conf and crun.conf",
		Example: examples(
			"gpucr install-criu-integration # runc, crun, podman, containerd then move GPU state",
			"gpucr install-criu-integration --remove",
		),
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if remove {
				r, err := in.Remove()
				if err != nil {
					return err
				}
				return a.emit(r, func() {
					fmt.Fprintf(a.stdout, "took %s out of CRIU's configuration\n", in.Script)
					for _, p := range r.Removed {
						fmt.Fprintf(a.stdout, "removed %s\n", p)
					}
					for _, k := range r.Kept {
						fmt.Fprintf(a.stdout, "kept %s\n", k)
					}
				})
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find gpucr's own binary: %w", err)
			}
			if in.Gpucr, err = filepath.EvalSymlinks(exe); err != nil {
				return fmt.Errorf("find gpucr's own binary: %w", err)
			}
			if err := in.Install(); err != nil {
				return err
			}
			out := installOutput{Configs: in.Configs(), Script: in.Script, Binary: in.Binary(), Log: in.Log}
			return a.emit(out, func() {
				fmt.Fprintf(a.stdout, "installed: %s runs %s criu-action (log %s)\n", in.Config, in.Binary(), in.Log)
				if in.CrunConfig != "" {
					if in.CrunReadsRunc() {
						fmt.Fprintf(a.stdout, "crun (1.26 or newer, with CRIU 4.2 or newer) reads %s while %s does not exist\n", in.Config, in.CrunConfig)
					} else {
						fmt.Fprintf(a.stdout, "installed: %s runs it too\n", in.CrunConfig)
					}
				}
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&in.Config, "config", container.DefaultRuncConfig, "CRIU configuration file that runc (and crun without its own) passes to CRIU")
	f.StringVar(&in.CrunConfig, "crun-config", container.DefaultCrunConfig, "crun's own CRIU configuration file, added to where it exists (\"\" leaves it alone)")
	f.StringVar(&in.Script, "script", container.DefaultScript, "where to write the action script")
	f.StringVar(&in.Log, "log", container.DefaultActionLog, "where the action script logs each step")
	f.StringVar(&in.StateDir, "state-dir", container.StateDir, "where the action script keeps what passes between steps")
	_ = f.MarkHidden("state-dir") // for tests that must not share the host's
	f.BoolVar(&remove, "remove", false, "take the integration out again")
	return cmd
}

// engineLine is the one line a failed step writes on the engine's stderr: the error may
// quote what the image holds (a crafted GPU record's backend name drove the terminal of
// runc's user), so it is shown as every error gpucr prints is.
func engineLine(err error) string { return "gpucr: " + printable(oneLine(err)) }

// actionGPUConfig is what the action's backends open with: the CRIU gpucr itself would run,
// whose plugins lie beside it, not the runtime's. Opened with none, the NVIDIA backend
// never found gpucr's CRIU plugin, so a runtime's dump of a container with a forked
// DataLoader worker was refused saying to install the plugin, installed or not, where the
// action means to say that only gpucr checkpoint --container carries such a process (review).
func (a *app) actionGPUConfig() gpu.Config {
	path, _ := criu.Locate(a.criuBinary()) // "": none here, and no plugin beside it
	return a.gpuConfig(path)
}
