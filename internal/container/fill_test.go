package container

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

// The hook lets the tasks go only on the verdict "ok": a damaged image, or the restoring
// gpucr's death before any verdict, fails the step (and CRIU kills the tasks).
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
	writeVerdict(work, os.ErrInvalid)
	if err := PostRestore(context.Background(), env, work, self, logger); err == nil || !strings.Contains(err.Error(), os.ErrInvalid.Error()) {
		t.Fatalf("damaged image: PostRestore = %v", err)
	}
	if _, ran := hookTook(work); ran {
		t.Fatal("a failed hook recorded a run")
	}

	work = t.TempDir()
	gone := txn.Proc{PID: self.PID, Start: self.Start + 1} // not this process: its start differs
	if err := PostRestore(context.Background(), env, work, gone, logger); err == nil || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("owner gone: PostRestore = %v", err)
	}

	work = t.TempDir()
	writeVerdict(work, nil)
	if err := PostRestore(context.Background(), env, work, self, logger); err != nil {
		t.Fatalf("verified, nothing to fill: PostRestore = %v", err)
	}
	if took, ran := hookTook(work); !ran || took != 0 {
		t.Fatalf("hookTook = %v, %v; want a run that filled nothing", took, ran)
	}
}
