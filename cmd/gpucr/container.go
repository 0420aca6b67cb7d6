package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/interrupt"
)

// runcFlags binds where runc is and where it keeps its state, for --container.
type runcFlags struct {
	path, root string
}

func (f *runcFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.path, "runc", "", "with --container: the runc binary (default: runc on PATH)")
	cmd.Flags().StringVar(&f.root, "runc-root", "", "with --container: runc's state directory (default: runc's own, /run/runc)")
}

// containers builds the container driver: the engine's CRIU and GPU backends, and runc
// told to use that CRIU.
func (a *app) containers(f runcFlags) (*container.Containers, error) {
	e, err := a.engine()
	if err != nil {
		return nil, err
	}
	path, err := container.FindRunc(f.path)
	if err != nil {
		return nil, err
	}
	return &container.Containers{Engine: e, Runc: &container.Runc{Path: path, Root: f.root, CRIU: e.CRIU.Path}}, nil
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
	if err := refuseRuncUnpassed(cmd); err != nil {
		return nil, err
	}
	runc, err := container.FindRunc(rf.path)
	if err != nil {
		return nil, classifyContainer(err)
	}
	return func(e *engine.Engine) engine.Target {
		c := &container.Containers{Engine: e, Runc: &container.Runc{Path: runc, Root: rf.root, CRIU: e.CRIU.Path}}
		return c.Target(ctr)
	}, nil
}

// restoreContainer is `gpucr restore --container ID`.
func (a *app) restoreContainer(ctx context.Context, cmd *cobra.Command, rf runcFlags, id string, r container.RestoreRequest, o criu.Options, pulled *transferOutput) error {
	if err := refuseRuncUnpassed(cmd); err != nil {
		return err
	}
	r.Flags = o.Flags
	info, err := container.ReadInfo(r.Dir)
	if err != nil {
		return usageError{fmt.Errorf("%s does not hold a container (restore it without --container): %w", r.Dir, err)}
	}
	if info.ID != id {
		return usageError{fmt.Errorf("%s holds container %s, not %s (use --new-id to restore it under another name)", r.Dir, info.ID, id)}
	}
	c, err := a.containers(rf)
	if err != nil {
		return classifyContainer(err)
	}
	ctx, stop := interrupt.Context(ctx)
	defer stop()
	start := time.Now()
	res, err := c.Restore(ctx, r)
	if err != nil {
		return classifyContainer(err)
	}
	out := restoreOutput{Dir: r.Dir, Container: res.ID, RootPID: res.RootPID, GPUMap: res.GPUMap, Pulled: pulled, Phases: phasesJSON(res.Phases), Total: time.Since(start).Seconds()}
	return a.emit(out, func() {
		if pulled != nil {
			printPull(a, *pulled)
		}
		printRestore(a, out, res.Phases)
	})
}

// classifyContainer gives the container errors users act on their exit code.
func classifyContainer(err error) error {
	switch {
	case errors.Is(err, container.ErrRuncMissing):
		return notReadyError{reason: err.Error()}
	case errors.Is(err, container.ErrNotRunning):
		return usageError{err}
	}
	return classify(err)
}
