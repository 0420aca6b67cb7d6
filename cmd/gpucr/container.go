package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/criu"
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

// containerCRIUFlags refuses the CRIU options runc does not pass on, and returns the rest.
func containerCRIUFlags(cmd *cobra.Command, o criu.Options) (container.CRIUFlags, error) {
	for _, name := range []string{"network-lock", "criu-log-level"} {
		if cmd.Flags().Changed(name) {
			return container.CRIUFlags{}, usageError{fmt.Errorf("--%s cannot be used with --container: runc does not pass it to CRIU", name)}
		}
	}
	return container.CRIUFlags{ShellJob: o.ShellJob, TCPEstablished: o.TCPEstablished, ExtUnixSk: o.ExtUnixSk, FileLocks: o.FileLocks}, nil
}

// checkpointContainer is `gpucr checkpoint --container ID`; with to, the image is then
// stored there, or, without -D, streamed there, as for a process tree.
func (a *app) checkpointContainer(cmd *cobra.Command, rf runcFlags, r container.CheckpointRequest, o criu.Options, to string) error {
	flags, err := containerCRIUFlags(cmd, o)
	if err != nil {
		return err
	}
	r.CRIUFlags = flags
	c, err := a.containers(rf)
	if err != nil {
		return classifyContainer(err)
	}
	ctx, stop := interrupt.Context(cmd.Context())
	defer stop()
	start := time.Now()
	var sc *streamed
	if r.Dir == "" { // --to alone: the memory streams to the store
		if sc, err = openStream(ctx, to); err != nil {
			return err
		}
		defer sc.close()
		r.Dir, r.Stream, to = sc.dir, sc.s, ""
		r.Scratch = []string{filepath.Dir(sc.dir)} // removed by the guardian if gpucr dies
	}
	m, err := c.Checkpoint(ctx, r)
	if m == nil {
		return classifyContainer(classifyStore(explainFullDisk(err)))
	}
	out := checkpointOutput{
		Dir: r.Dir, Container: r.ID, RootPID: m.RootPID, Processes: len(m.Processes), MemoryBytes: m.MemoryBytes,
		LeftRunning: r.LeaveRunning, Phases: phasesJSON(m.Phases), Total: time.Since(start).Seconds(),
	}
	if sc != nil {
		out.Dir, out.Streamed, out.Pushed = sc.url, true, sc.output()
	}
	for _, s := range m.GPUs {
		for _, p := range s.Processes {
			out.GPUProcesses++
			out.GPUBytes += p.MemoryBytes
		}
	}
	if err != nil {
		to = "" // the image is written, the container's end failed: not stored, said below
	}
	if emitErr := a.storeAndEmit(ctx, out, m.Phases, r.Dir, to); emitErr != nil {
		return emitErr
	}
	return err // the image is written; what became of the container afterwards failed
}

// restoreContainer is `gpucr restore --container ID`.
func (a *app) restoreContainer(ctx context.Context, cmd *cobra.Command, rf runcFlags, id string, r container.RestoreRequest, o criu.Options, pulled *transferOutput) error {
	if _, err := containerCRIUFlags(cmd, o); err != nil {
		return err
	}
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
