// Package engine owns the order of a checkpoint and a restore: GPU lock and checkpoint, CRIU
// dump, image commit, and the rollback that keeps the workload running when any step fails.
package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/meter"
)

// Errors users act on; the CLI maps them to messages and exit codes.
var (
	ErrNotRoot = errors.New("gpucr must run as root (CRIU needs it)")
	// ErrNamespaceInit is a restore asked of a gpucr that is the first process of its PID
	// namespace: the kernel kills every process of the namespace when that process exits,
	// so the detached tree it restored died with it while it reported success (hostile
	// test: `unshare --pid --fork gpucr restore`, which the PID-in-use message suggested).
	ErrNamespaceInit = errors.New("gpucr is PID 1 of its PID namespace, and what it restores would be killed when it exits; " +
		"run gpucr restore in the namespace the job is to live in (not as the first process of `unshare --pid --fork` or of a container)")
	// ErrForeignProc is a restore in a PID namespace whose /proc is its parent's (unshare
	// --pid --fork without --mount-proc): CRIU cannot start there, and the restore failed
	// in CRIU naming a log it never wrote, after warning of the host's PID 1 as gpucr's
	// parent (hostile test).
	ErrForeignProc = errors.New("/proc here is another PID namespace's, and gpucr and CRIU work only with their own namespace's /proc; " +
		"mount one for it (unshare --pid --fork --mount-proc) or run gpucr outside the namespace")
	ErrBadTarget = errors.New("refusing to checkpoint this process")
	// ErrBadRequest is a restore asked for what its image cannot give.
	ErrBadRequest = errors.New("refusing the restore")
	ErrPIDInUse   = errors.New("a PID the image needs is in use")
	ErrNoFile     = errors.New("a file the image needs is missing on this host")
	// ErrFileChanged is a file the image reopens whose owner or kind changed since.
	ErrFileChanged = errors.New("a file the image reopens is not the one it had")
	ErrTreeImage   = errors.New("this image cannot be restored as a process tree")
	ErrNoBackend   = errors.New("no GPU backend for this image")
	ErrGPURestore  = errors.New("GPU restore failed")
	// ErrNameTooLong is a destination whose staging name beside it a file system cannot hold.
	ErrNameTooLong = errors.New("the name is too long")
)

// Engine checkpoints and restores process trees with one CRIU and the GPU backends that
// work on this host.
type Engine struct {
	CRIU     *criu.Driver
	Backends []gpu.Backend
	// Off are the vendors whose backends cannot work here: a tree using their GPUs is
	// refused, and an image holding their state too, with the reason.
	Off     []gpu.Off
	Version string // gpucr's version, recorded in images
	Log     *slog.Logger
	Report  Reporter
	// THPSwitch is the transparent huge page switch to hold at "always" while GPU state
	// moves through host memory, and put back after; empty leaves the host alone.
	THPSwitch string
	// JournalRoot is where operations are journaled and locked (txn.DefaultRoot); empty
	// journals nothing. Guardian is the command that watches an operation for gpucr's death
	// (its record's ID is appended); empty starts none.
	JournalRoot string
	Guardian    []string
}

// Reporter hears about long phases as they start and end, for progress displays.
type Reporter interface {
	Start(phase string)
	Done(phase string, d time.Duration)
}

// ByteReporter is a Reporter that can also show the bytes a phase moves: for a phase that
// counts them, the engine calls StartBytes instead of Start, with the counter the phase's
// work adds to as it goes.
type ByteReporter interface {
	Reporter
	StartBytes(phase string, c *meter.Counter)
}

// Phase names, as recorded in manifests and printed in summaries.
const (
	PhaseGPULock       = "gpu-lock"
	PhaseGPUCheckpoint = "gpu-checkpoint"
	PhaseCRIUDump      = "criu-dump"
	PhaseMemorySave    = "memory-save" // the large runs of memory gpucr saves itself, frozen
	PhaseCommit        = "commit"
	PhaseGPUResume     = "gpu-resume"
	PhaseVerify        = "verify"
	PhaseCRIURestore   = "criu-restore"
	PhaseMemoryFill    = "memory-fill" // within criu-restore: the memory gpucr writes itself
	PhaseGPURestore    = "gpu-restore"
)

type noReport struct{}

func (noReport) Start(string)               {}
func (noReport) Done(string, time.Duration) {}

func (e *Engine) reporter() Reporter {
	if e.Report == nil {
		return noReport{}
	}
	return e.Report
}

// Logger is the engine's logger, or one that discards.
func (e *Engine) Logger() *slog.Logger {
	if e.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Log
}

// Timer records the phases of a checkpoint or restore, in order, and reports each.
type Timer struct {
	r      Reporter
	op     *Op // journals each phase as it starts
	Phases []image.Phase
}

// logger is the log of the operation the timer journals to, if any.
func (t *Timer) logger() *slog.Logger {
	if t.op == nil || t.op.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return t.op.log
}

// NewTimer is a Timer reporting to the engine's reporter and journaling to op.
func (e *Engine) NewTimer(op *Op) *Timer { return &Timer{r: e.reporter(), op: op} }

// Run times f as the phase name. A zero Timer reports to no one and journals nothing.
func (t *Timer) Run(name string, f func() error) error {
	return t.run(name, nil, f)
}

// RunCounted is Run for a phase that moves bytes: f's context carries the meter.Counter
// that the work below counts them into, for a ByteReporter to show.
func (t *Timer) RunCounted(ctx context.Context, name string, f func(context.Context) error) error {
	c := new(meter.Counter)
	return t.run(name, c, func() error { return f(meter.With(ctx, c)) })
}

func (t *Timer) run(name string, c *meter.Counter, f func() error) error {
	if t.r == nil {
		t.r = noReport{}
	}
	if br, ok := t.r.(ByteReporter); ok && c != nil {
		br.StartBytes(name, c)
	} else {
		t.r.Start(name)
	}
	t.op.Phase(name)
	crashpoint.Hit("start " + name)
	start := time.Now()
	err := f()
	d := time.Since(start)
	t.Phases = append(t.Phases, image.Phase{Name: name, Duration: d})
	t.r.Done(name, d)
	crashpoint.Hit("end " + name)
	return err
}
