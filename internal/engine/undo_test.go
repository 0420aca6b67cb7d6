package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
)

// The one rollback: a failure undoes every step, last first, with a context that is not
// cancelled; a success undoes only what is held for the operation's length.
func TestUndoUnwindsLastFirst(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cause  error
		commit bool
		want   []string
	}{
		{"failed", errors.New("dump failed"), false, []string{"server", "gpus", "thp"}},
		{"committed", nil, true, []string{"server", "thp"}},
		{"failed after commit", errors.New("late"), true, []string{"server", "gpus", "thp"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			step := func(name string) func(context.Context) error {
				return func(ctx context.Context) error {
					if ctx.Err() != nil {
						t.Errorf("%s undone with a cancelled context", name)
					}
					got = append(got, name)
					return nil
				}
			}
			var u Undo
			u.Always("thp", step("thp"))
			u.OnFail("gpus", step("gpus"))
			u.Always("server", step("server"))
			if tc.commit {
				u.Commit()
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := u.Unwind(ctx, tc.cause); !errors.Is(err, tc.cause) {
				t.Fatalf("Unwind = %v, want the cause %v", err, tc.cause)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("undone %v, want %v", got, tc.want)
			}
		})
	}
}

// A step that cannot be undone is named in the one-line error, after the cause, and the
// steps below it are still undone.
func TestUndoReportsFailedSteps(t *testing.T) {
	var u Undo
	resumed := false
	u.OnFail("resume the GPU processes", func(context.Context) error { resumed = true; return nil })
	u.OnFail("resume container web", func(context.Context) error { return errors.New("runc: exit 1") })
	cause := errors.New("criu dump failed")
	err := u.Unwind(context.Background(), cause)
	if !errors.Is(err, cause) || !resumed {
		t.Fatalf("Unwind = %v (GPUs resumed: %v)", err, resumed)
	}
	want := "criu dump failed; resume container web also failed: runc: exit 1"
	if err.Error() != want || strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %q, want %q", err, want)
	}
}

// A container to be left running that runc would not resume kept its GPU processes
// checkpointed, and the message said only that it was left paused: resumed by hand, the
// job hung on its GPUs (review). The message says what brings them back.
func TestLeftPausedSaysTheGPUsStayCheckpointed(t *testing.T) {
	r := &GPUResume{gpus: GPUSet{{Process: gpu.Process{PID: 41}}, {Process: gpu.Process{PID: 42}}}}
	if got := r.leftHint(true); !strings.Contains(got, "gpucr recover --pid 41,42") {
		t.Errorf("hint %q, want the recover command for both processes", got)
	}
	if got := r.leftHint(false); got != "" {
		t.Errorf("a tree not left running: hint %q", got)
	}
	if got := (*GPUResume)(nil).leftHint(true); got != "" {
		t.Errorf("no GPUs: hint %q", got)
	}
}
