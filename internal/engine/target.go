package engine

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/proctree"
)

// A Target is what a checkpoint acts on, and how CRIU reaches it: a process tree that
// gpucr dumps through CRIU's RPC, or a container whose runtime drives CRIU. The sequence
// around it (GPU state, journal, memory, commit, rollback) is the engine's alone.
type Target interface {
	// Open checks that the target may be checkpointed and returns its processes as the
	// host numbers them, root first.
	Open(ctx context.Context) ([]proctree.Process, error)
	// What names it in messages and the journal: "PID 4242", "container web".
	What() string
	// Locks are the names that keep other gpucr operations off it while this one runs.
	Locks() []string
	// ImagePID is how the image numbers host process pid: the same for a process tree,
	// the container's own PID for a container (its restore gets new host PIDs).
	ImagePID(pid int) (int, error)
	// CRIUPlugins says whether CRIU plugins (AMD's, for /dev/kfd) can be loaded for it.
	CRIUPlugins() bool
	// Freeze stops the tree before its dump where CRIU's own freeze is not enough, pushing
	// what undoes that; most targets need nothing.
	Freeze(ctx context.Context, op *Op, undo *Undo) error
	// Dump has CRIU dump the tree as d says (d.PID is the target's to fill) and calls
	// commit once every file is written, with the tree still frozen; commit's error fails
	// the dump, and the tree must then run on as before.
	Dump(ctx context.Context, d criu.DumpRequest, commit func() error) error
	// Describe writes the target's own files into the staged image directory dir.
	Describe(dir string) error
	// Release ends the tree's part once its image is committed: it is gone, or with
	// leaveRunning it runs again (its GPUs are the engine's to resume).
	Release(ctx context.Context, leaveRunning bool) error
}

// Tree is the target for the process tree rooted at pid, dumped through CRIU's RPC.
func (e *Engine) Tree(pid int) Target { return &processTree{e: e, pid: pid} }

type processTree struct {
	e    *Engine
	pid  int
	tree []proctree.Process
}

func (p *processTree) What() string                  { return fmt.Sprintf("PID %d", p.pid) }
func (p *processTree) Locks() []string               { return []string{PIDLock(p.pid)} }
func (p *processTree) ImagePID(pid int) (int, error) { return pid, nil }
func (p *processTree) CRIUPlugins() bool             { return true }
func (p *processTree) Describe(string) error         { return nil }

// Freeze does nothing: CRIU freezes the tree itself at the start of its dump, and thaws
// it if the dump fails.
func (p *processTree) Freeze(context.Context, *Op, *Undo) error { return nil }

func (p *processTree) Open(context.Context) ([]proctree.Process, error) {
	pid := p.pid
	switch {
	case pid <= 0:
		return nil, fmt.Errorf("%w: %d is not a valid PID", ErrBadTarget, pid)
	case pid == 1:
		return nil, fmt.Errorf("%w: PID 1 is the init process", ErrBadTarget)
	case pid == os.Getpid():
		return nil, fmt.Errorf("%w: PID %d is gpucr itself", ErrBadTarget, pid)
	}
	tree, err := proctree.Tree(pid)
	if err != nil {
		return nil, err
	}
	if slices.Contains(proctree.PIDs(tree), os.Getpid()) {
		return nil, fmt.Errorf("%w: gpucr itself runs inside the tree of PID %d", ErrBadTarget, pid)
	}
	p.tree = tree
	return tree, nil
}

// Dump commits from CRIU's post-dump notification, while CRIU still holds the tree:
// CRIU resumes the tree when the notification fails and kills it (or, leaving it
// running, thaws it) when it succeeds.
func (p *processTree) Dump(ctx context.Context, d criu.DumpRequest, commit func() error) error {
	d.PID = p.pid
	return p.e.CRIU.Dump(ctx, d, postDump{commit: commit})
}

type postDump struct {
	criu.NoNotify
	commit func() error
}

func (n postDump) PostDump() error { return n.commit() }

// Release returns, for a killed tree, only once its PIDs and sockets are free, so that a
// restore right after this checkpoint does not find them taken.
func (p *processTree) Release(_ context.Context, leaveRunning bool) error {
	if leaveRunning {
		return nil
	}
	if left := waitExited(proctree.PIDs(p.tree), exitWait); len(left) > 0 {
		p.e.Logger().Warn("checkpointed processes are still exiting", "pids", left)
	}
	return nil
}

// PIDLock names the lock that keeps two gpucr operations off one process tree.
func PIDLock(pid int) string { return fmt.Sprintf("pid-%d", pid) }

// ContainerLock names the lock that keeps two gpucr operations off one container.
func ContainerLock(id string) string { return "container-" + id }
