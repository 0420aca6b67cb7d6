package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/txn"
)

// actionStateDir holds what the CRIU action script passes from one step to a later one.
const actionStateDir = "/run/gpucr/criu-action"

// criuActionCmd is the CRIU action script of the runc integration (hidden: CRIU runs it,
// people do not). With --rollback-after it is instead the watcher that pre-dump starts.
func (a *app) criuActionCmd() *cobra.Command {
	var logPath, heldPath, work, owner string
	var lockTimeout time.Duration
	cmd := &cobra.Command{
		Use:    "criu-action",
		Short:  "CRIU action script that moves GPU state during runc checkpoint and restore",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, closeLog := actionLog(logPath, a.stderr)
			defer closeLog()
			log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo}))
			if heldPath != "" {
				if err := container.WaitCRIU(); err != nil {
					log.Error("rollback watcher", "err", err)
					return err
				}
				backends, _ := gpu.Probe(a.cfg.gpu)
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
				backends, _ = gpu.Probe(a.cfg.gpu)
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find gpucr's own binary: %w", err)
			}
			act := &container.Action{
				Backends: backends, Getenv: os.Getenv, CRIUPID: os.Getppid(), StateDir: actionStateDir,
				LockTimeout: lockTimeout, Version: version, Log: log,
				Watch: func(criuPID int, held string) error {
					args := []string{"criu-action", "--rollback-after", held}
					if logPath != "" {
						args = append(args, "--log", logPath)
					}
					return container.StartWatcher(exe, args, criuPID)
				},
			}
			return act.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&logPath, "log", "", "append a line per step to this file (default: stderr)")
	f.DurationVar(&lockTimeout, "lock-timeout", 10*time.Second, "how long to wait for GPU work in flight before giving up")
	f.StringVar(&heldPath, "rollback-after", "", "wait for the CRIU on descriptor 3 to exit, then resume the GPU processes listed in this file")
	_ = f.MarkHidden("rollback-after")
	f.StringVar(&work, "post-restore", "", "at post-restore, wait for the verdict on the image in this restore work directory and fill the memory it plans (gpucr restore --container)")
	f.StringVar(&owner, "owner", "", "with --post-restore: PID:START of the gpucr that runs the restore")
	_ = f.MarkHidden("post-restore")
	_ = f.MarkHidden("owner")
	return cmd
}

// actionLog opens the action script's log for appending, falling back to stderr: a log
// that cannot be opened must not fail a checkpoint.
func actionLog(path string, stderr io.Writer) (io.Writer, func()) {
	if path == "" {
		return stderr, func() {}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
			return f, func() { f.Close() }
		}
	}
	return stderr, func() {}
}

// installRuncCmd installs (or removes) the runc integration.
func (a *app) installRuncCmd() *cobra.Command {
	var in container.Integration
	var remove bool
	cmd := &cobra.Command{
		Use:   "install-runc-integration",
		Short: "Make plain runc checkpoint/restore (and podman, containerd) move GPU state, through CRIU's runc.conf",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if remove {
				if err := in.Remove(); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "removed %s from %s\n", in.Script, in.Config)
				return nil
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
			fmt.Fprintf(a.stdout, "installed: %s runs %s criu-action (log %s)\n", in.Config, in.Script, in.Log)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&in.Config, "config", container.DefaultRuncConfig, "CRIU configuration file that runc passes to CRIU")
	f.StringVar(&in.Script, "script", container.DefaultScript, "where to write the action script")
	f.StringVar(&in.Log, "log", container.DefaultActionLog, "where the action script logs each step")
	f.BoolVar(&remove, "remove", false, "take the integration out again")
	return cmd
}
