package engine

import (
	"context"
	"fmt"
	"strings"
)

// Undo is what an operation has changed so far, each change with what reverses it: the one
// rollback of a checkpoint, whatever its target. Steps are undone last first. A step pushed
// with OnFail is undone only if the operation fails before commit; one pushed with Always
// also when it succeeds (a setting held for the operation's length, a server, scratch).
type Undo struct {
	steps     []undoStep
	committed bool
}

type undoStep struct {
	what   string
	always bool
	undo   func(context.Context) error
}

func (s *Undo) OnFail(what string, undo func(context.Context) error) {
	s.steps = append(s.steps, undoStep{what: what, undo: undo})
}

func (s *Undo) Always(what string, undo func(context.Context) error) {
	s.steps = append(s.steps, undoStep{what: what, always: true, undo: undo})
}

// Commit marks the operation done: from now on only the always-steps are undone.
func (s *Undo) Commit() { s.committed = true }

// Unwind undoes the steps, last first, and returns cause joined with every undo that
// failed. It runs with ctx's values but never its cancellation: a rollback interrupted
// halfway is what loses a job.
func (s *Undo) Unwind(ctx context.Context, cause error) error {
	ctx = context.WithoutCancel(ctx)
	failed := cause != nil || !s.committed
	var also []string
	for i := len(s.steps) - 1; i >= 0; i-- {
		st := s.steps[i]
		if !st.always && !failed {
			continue
		}
		if err := st.undo(ctx); err != nil {
			also = append(also, fmt.Sprintf("%s also failed: %v", st.what, err))
		}
	}
	s.steps = nil
	if len(also) == 0 {
		return cause
	}
	return &RollbackError{Cause: cause, Failed: also}
}

// RollbackError is an operation that failed (Cause, nil if it had succeeded) and whose
// rollback did not undo everything (Failed, one line each): what the operation changed is
// not all put back, so no message may say the workload runs on.
type RollbackError struct {
	Cause  error
	Failed []string
}

func (e *RollbackError) Error() string {
	if e.Cause == nil {
		return strings.Join(e.Failed, "; ")
	}
	return fmt.Sprintf("%v; %s", e.Cause, strings.Join(e.Failed, "; "))
}

func (e *RollbackError) Unwrap() error { return e.Cause }
