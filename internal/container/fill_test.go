package container

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/txn"
)

// The reason the post-restore hook failed is read back from its log for the restore's error.
func TestHookFailureReadsTheLoggedError(t *testing.T) {
	work := t.TempDir()
	if got := hookFailure(work); got != "" {
		t.Errorf("no log: %q", got)
	}
	log := `time=x level=INFO msg="already done by this step's first run"
time=y level=ERROR msg="post-restore failed" err="memory fill: process 7 of the image is not among the restored processes"
`
	if err := os.WriteFile(filepath.Join(work, hookLog), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := hookFailure(work), "memory fill: process 7 of the image is not among the restored processes"; got != want {
		t.Errorf("hookFailure = %q, want %q", got, want)
	}
}

// The hook names the restored init, then lets the tasks go only on the verdict "ok": a
// damaged image or a failed fill, or the restoring gpucr's death before any verdict, fails
// the step (and CRIU kills the tasks).
func TestPostRestoreHookWaitsForTheVerdict(t *testing.T) {
	env := func(k string) string {
		return map[string]string{envAction: "post-restore", envInitPID: "1"}[k]
	}
	self, err := txn.ProcOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)

	work := t.TempDir()
	if err := writeVerdict(work, os.ErrInvalid); err != nil {
		t.Fatal(err)
	}
	if err := PostRestore(context.Background(), env, work, self, logger); err == nil || !strings.Contains(err.Error(), os.ErrInvalid.Error()) {
		t.Fatalf("damaged image: PostRestore = %v", err)
	}
	if hookRan(work) {
		t.Fatal("a failed hook recorded a run")
	}
	if b, err := os.ReadFile(filepath.Join(work, restoredName)); err != nil || string(b) != "1" {
		t.Fatalf("the hook named init %q (%v), want CRIU's 1", b, err)
	}

	work = t.TempDir()
	gone := txn.Proc{PID: self.PID, Start: self.Start + 1} // not this process: its start differs
	if err := PostRestore(context.Background(), env, work, gone, logger); err == nil || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("owner gone: PostRestore = %v", err)
	}

	work = t.TempDir()
	if err := writeVerdict(work, nil); err != nil {
		t.Fatal(err)
	}
	if err := PostRestore(context.Background(), env, work, self, logger); err != nil || !hookRan(work) {
		t.Fatalf("verified and filled: PostRestore = %v, ran %v", err, hookRan(work))
	}
}

// gpucr's side waits for the hook to name the init, then gives its verdict: the image's
// verification failing is the verdict; runc ending first (no hook ran) gives none.
func TestHoldTasksGivesTheHookItsVerdict(t *testing.T) {
	work := t.TempDir()
	s := engine.RestoreSpec{Verified: func() error { return image.ErrCorrupt }}
	s.WorkDir = work
	if err := os.WriteFile(filepath.Join(work, restoredName), []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, filled, _ := holdTasks(context.Background(), s, nil, func() {}); filled {
		t.Fatal("a damaged image was filled")
	}
	if b, _ := os.ReadFile(filepath.Join(work, verdictName)); string(b) != image.ErrCorrupt.Error() {
		t.Fatalf("verdict %q, want the verification's error", b)
	}

	s.Verified = func() error { return nil }
	if took, filled, _ := holdTasks(context.Background(), s, nil, func() {}); !filled || took != 0 {
		t.Fatalf("verified, nothing to fill: %v, %v", took, filled)
	}
	if b, _ := os.ReadFile(filepath.Join(work, verdictName)); string(b) != verdictOK {
		t.Fatalf("verdict %q, want ok", b)
	}

	s.WorkDir = t.TempDir()
	stop := make(chan struct{})
	close(stop)
	if _, filled, _ := holdTasks(context.Background(), s, stop, func() {}); filled {
		t.Fatal("no hook ran, yet the tasks count as filled")
	}
	if _, err := os.Stat(filepath.Join(s.WorkDir, verdictName)); err == nil {
		t.Fatal("a verdict was given with no hook waiting")
	}
}

// A verdict that could not be written (a full TMPDIR) left the hook waiting for it as long
// as gpucr lived, and gpucr waiting for runc (review): the hook is refused at once, and
// gpucr says why.
func TestVerdictThatCannotBeWrittenRefusesTheTasks(t *testing.T) {
	work := t.TempDir()
	if err := os.MkdirAll(filepath.Join(work, verdictName, "taken"), 0o700); err != nil {
		t.Fatal(err) // no verdict can be renamed over a directory that holds something
	}
	s := engine.RestoreSpec{Verified: func() error { return nil }}
	s.WorkDir = work
	if err := os.WriteFile(filepath.Join(work, restoredName), []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, filled, refused := holdTasks(context.Background(), s, nil, func() {}); filled || refused == nil {
		t.Fatalf("holdTasks = filled %v, %v; want the tasks refused and why", filled, refused)
	}
	self, err := txn.ProcOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = waitVerdict(ctx, work, self)
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the hook's wait = %v, want a refusal at once", err)
	}
}
