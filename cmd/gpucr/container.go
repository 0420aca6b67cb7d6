package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/engine"
)

// runcFlags binds where runc is and where it keeps its state, for --container.
type runcFlags struct {
	path, root string
}

func (f *runcFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.path, "runc", "", "with --container: the runc binary (default: runc on PATH)")
	cmd.Flags().StringVar(&f.root, "runc-root", "", "with --container: runc's state directory (default: runc's own, /run/runc)")
}

// containers is the container driver over e: its CRIU and GPU backends, and the runc at
// path told to use that CRIU.
func containers(e *engine.Engine, path string, f runcFlags) *container.Containers {
	return &container.Containers{Engine: e, Runc: &container.Runc{Path: path, Root: f.root, CRIU: e.CRIU.Path}}
}

// findRunc finds the runc of f and refuses a state directory users other than root could
// change. Both are made absolute, f's root in place: the journal records the runc command
// line for a later recovery to run from wherever it runs, and a --runc-root rr recorded as
// given had gpucr recover, run from another directory, find no container to resume or
// remove (hostile test: the record failed every recover, the container left paused).
func findRunc(f *runcFlags) (string, error) {
	path, err := container.FindRunc(f.path)
	if err == nil {
		path, err = filepath.Abs(path)
	}
	if err != nil {
		return "", classifyContainer(err)
	}
	if f.root != "" {
		if f.root, err = filepath.Abs(f.root); err != nil {
			return "", usageError{fmt.Errorf("--runc-root: %w", err)}
		}
	}
	if err := (&container.Runc{Root: f.root}).CheckRoot(); err != nil {
		return "", usageError{fmt.Errorf("--runc-root: %w", err)}
	}
	return path, nil
}

// containerOnly are the flags only a container's checkpoint or restore reads.
var containerOnly = []string{"runc", "runc-root", "new-id", "bundle"}

// refuseContainerOnly refuses, without --container, a flag that only a container's
// checkpoint or restore reads: `checkpoint PID -D DIR --runc-root R` passed over it and
// checkpointed the tree, which then stopped, though the user meant a container
// (documentation walk).
func refuseContainerOnly(cmd *cobra.Command) error {
	for _, name := range containerOnly {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return usageError{fmt.Errorf("--%s needs --container ID: it is read only for a container", name)}
		}
	}
	return nil
}

// refuseRuncUnpassed refuses the CRIU options runc does not pass on.
func refuseRuncUnpassed(cmd *cobra.Command) error {
	for _, name := range []string{"network-lock", "criu-log-level"} {
		if cmd.Flags().Changed(name) {
			return usageError{fmt.Errorf("--%s cannot be used with --container: runc does not pass it to CRIU", name)}
		}
	}
	return nil
}

// checkpointTarget is what `gpucr checkpoint` was asked to checkpoint: the tree of the PID
// in args, or the runc container ctr; it is built once the engine is.
func (a *app) checkpointTarget(cmd *cobra.Command, args []string, ctr string, rf runcFlags, o criu.Options) (func(*engine.Engine) engine.Target, error) {
	if ctr == "" {
		if err := refuseContainerOnly(cmd); err != nil {
			return nil, err
		}
		if len(args) == 0 {
			return nil, usageError{fmt.Errorf("give the PID of the tree to checkpoint, or --container ID")}
		}
		pid, err := strconv.Atoi(args[0])
		if err != nil {
			return nil, usageError{fmt.Errorf("PID %q is not a number", args[0])}
		}
		return func(e *engine.Engine) engine.Target { return e.Tree(pid) }, nil
	}
	if len(args) > 0 {
		return nil, usageError{fmt.Errorf("give either a PID or --container ID, not both")}
	}
	if err := engine.CheckContainerID(ctr); err != nil {
		return nil, usageError{fmt.Errorf("--container: %w", err)}
	}
	if err := refuseRuncUnpassed(cmd); err != nil {
		return nil, err
	}
	runc, err := findRunc(&rf)
	if err != nil {
		return nil, err
	}
	return func(e *engine.Engine) engine.Target { return containers(e, runc, rf).Target(ctr) }, nil
}

// restoreTarget is what `gpucr restore` restores the image at dir as: the process tree it
// holds, or, with --container ctr, the container (under newID and from bundle when given).
func (a *app) restoreTarget(cmd *cobra.Command, rf runcFlags, dir, ctr, newID, bundle string) (func(*engine.Engine) engine.RestoreTarget, error) {
	if ctr == "" {
		return func(e *engine.Engine) engine.RestoreTarget { return e.TreeImage() }, nil
	}
	for _, f := range []struct{ flag, id string }{{"--container", ctr}, {"--new-id", newID}} {
		if f.id == "" {
			continue // no --new-id: the image's own ID, checked once the image is opened
		}
		if err := engine.CheckContainerID(f.id); err != nil {
			return nil, usageError{fmt.Errorf("%s: %w", f.flag, err)}
		}
	}
	if err := refuseRuncUnpassed(cmd); err != nil {
		return nil, err
	}
	info, err := container.ReadInfo(dir)
	if err != nil {
		return nil, usageError{fmt.Errorf("%s does not hold a container (restore it without --container): %w", dir, err)}
	}
	if info.ID != ctr {
		return nil, usageError{fmt.Errorf("%s holds container %s, not %s (use --new-id to restore it under another name)", dir, info.ID, ctr)}
	}
	runc, err := findRunc(&rf)
	if err != nil {
		return nil, err
	}
	return func(e *engine.Engine) engine.RestoreTarget { return containers(e, runc, rf).Image(newID, bundle) }, nil
}

// classifyContainer gives the container errors users act on their exit code.
func classifyContainer(err error) error {
	switch {
	case errors.Is(err, container.ErrRuncMissing):
		return notReadyError{reason: err.Error()}
	case errors.Is(err, container.ErrNotRunning), errors.Is(err, container.ErrEngineOwned), errors.Is(err, container.ErrNoContainer),
		errors.Is(err, container.ErrExists):
		return usageError{err}
	}
	return classify(err)
}
