package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"

	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/guardian"
	"github.com/gpucr/gpucr/internal/hosttune"
	"github.com/gpucr/gpucr/internal/txn"
)

// Op is one checkpoint or restore in flight: its journal record, the locks on what it
// works on, and the guardian that finishes its rollback if gpucr dies. Without a journal
// (Engine.JournalRoot empty: library use, unit tests) every method does nothing.
type Op struct {
	j     *txn.Journal
	g     *guardian.Guardian
	locks []*txn.Lock
	log   *slog.Logger
}

// holderText is what an operation's locks say of it: its gpucr's PID, the operation and
// its target.
const holderText = "gpucr PID %d is running a %s of %s"

// whatToDoWhenBusy says what to do about a lock another operation holds: wait for it; or,
// where the gpucr its lock names is gone, its guardian holds the lock while it rolls that
// gpucr's work back, and a retry in a moment goes ahead (crash test: the refusal told the
// user to wait for a gpucr that had been killed).
func whatToDoWhenBusy(err error) string {
	var pid int
	_, text, _ := strings.Cut(err.Error(), "gpucr PID ")
	if _, serr := fmt.Sscanf(text, "%d", &pid); serr == nil && pid > 0 && syscall.Kill(pid, 0) == syscall.ESRCH {
		return "that gpucr is gone, and its guardian is rolling its work back: retry in a few seconds, or see gpucr check"
	}
	return "wait for it to finish, or see gpucr check"
}

// Begin locks targets ("pid-4242", "container-web") against other gpucr operations,
// writes the journal record of op and starts its guardian. Nothing on the host has changed
// yet; every change after this is recorded before it is made.
func (e *Engine) Begin(op, what string, targets ...string) (*Op, error) {
	return e.begin(op, what, nil, targets...)
}

// begin is Begin for an operation that already owns paths (a streamed restore's fetched
// files): they are journaled with its locks, before any point at which gpucr can die with
// them unrecorded once the operation exists.
func (e *Engine) begin(op, what string, owned []string, targets ...string) (*Op, error) {
	o := &Op{log: e.Logger()}
	if e.JournalRoot == "" {
		return o, nil
	}
	// What a dead gpucr left is put right first; what cannot be (a backend missing here,
	// say) is no reason to refuse other work, and gpucr check keeps listing it.
	if _, err := e.RecoverStale(); err != nil {
		o.log.Warn("an operation cut off by gpucr's death could not be rolled back; see gpucr check", "err", err)
	}
	holder := fmt.Sprintf(holderText, os.Getpid(), op, what)
	locks, _, err := txn.LockTargets(e.JournalRoot, holder, targets)
	if errors.Is(err, txn.ErrBusy) {
		return nil, fmt.Errorf("%s: %w (%s)", what, err, whatToDoWhenBusy(err))
	}
	if err != nil {
		return nil, err
	}
	o.locks = locks
	j, err := txn.Begin(e.JournalRoot, op, what)
	if err != nil {
		o.releaseLocks()
		return nil, err
	}
	o.j = j
	if err := j.Update(func(r *txn.Record) { r.Locks, r.Paths = targets, owned }); err != nil {
		err = errors.Join(err, j.End())
		o.releaseLocks()
		return nil, err
	}
	if len(e.Guardian) > 0 {
		args := append(append([]string(nil), e.Guardian...), "--id", j.ID())
		if o.g, err = guardian.Start(args, j, o.locks); err != nil {
			err = errors.Join(err, j.End())
			o.releaseLocks()
			return nil, err
		}
	}
	crashpoint.Hit("begin")
	return o, nil
}

// ID names the operation's record ("" without a journal): it also names its staging.
func (o *Op) ID() string {
	if o == nil || o.j == nil {
		return ""
	}
	return o.j.ID()
}

// Update records a change before it is made; the operation must not make a change it
// could not record.
func (o *Op) Update(change func(*txn.Record)) error {
	if o == nil || o.j == nil {
		return nil
	}
	return o.j.Update(change)
}

// Phase records where the operation has got to. Failing to record a phase loses only
// detail (every change is recorded on its own), so it is logged.
func (o *Op) Phase(name string) {
	if o == nil || o.j == nil {
		return
	}
	if err := o.j.Phase(name); err != nil {
		o.log.Warn("journal", "err", err)
	}
}

// End removes the record and dismisses the guardian: the operation committed or was rolled
// back by gpucr itself.
func (o *Op) End() {
	if o == nil || o.j == nil {
		return
	}
	crashpoint.Hit("end")
	if err := o.j.End(); err != nil {
		o.log.Warn("journal", "err", err)
	}
	if err := o.g.Dismiss(); err != nil {
		o.log.Warn("guardian", "err", err)
	}
	o.releaseLocks()
	o.j = nil
}

func (o *Op) releaseLocks() {
	for _, l := range o.locks {
		l.Release()
	}
	o.locks = nil
}

// TuneHost sets THP for a GPU operation, recording the old mode in op's journal first, and
// returns what puts it back. Failing to set it only costs speed, so it is logged.
func (e *Engine) TuneHost(op *Op) func() {
	if e.THPSwitch == "" {
		return func() {}
	}
	restore, err := hosttune.THPAlways(e.THPSwitch, func(prev string) error {
		return op.Update(func(r *txn.Record) { r.THP = &txn.Setting{Path: e.THPSwitch, Old: prev} })
	})
	if err != nil {
		e.Logger().Warn("transparent huge pages left as they are", "err", err)
		return func() {}
	}
	return func() {
		if err := restore(); err != nil {
			e.Logger().Error("could not put transparent huge pages back", "err", err)
			return
		}
		if err := op.Update(func(r *txn.Record) { r.THP = nil }); err != nil {
			e.Logger().Warn("journal", "err", err)
		}
	}
}
