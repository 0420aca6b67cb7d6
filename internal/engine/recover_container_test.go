package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// fakeRuntime writes a runtime command that refuses `resume` as runc does for a container
// that is not paused, and reports status from `state`.
func fakeRuntime(t *testing.T, status string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runtime")
	script := `#!/bin/sh
case "$1" in
resume) echo "container not paused" >&2; exit 1 ;;
state) echo '{"id": "'"$2"'", "status": "` + status + `"}' ;;
esac
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return []string{path}
}

// A checkpoint's rollback resumes the container it paused; one that already runs (the
// runtime's failed dump resumed it) is the outcome wanted, not a failed rollback, and so is
// one whose processes are gone (it stopped or was deleted: nothing is left frozen; a CI
// machine met such an entry retried, and failing, at every later gpucr run). One still
// paused with its processes alive is reported.
func TestRollbackResumesContainerUnlessItRuns(t *testing.T) {
	ctx := context.Background()
	live, err := txn.ProcOf(testutil.StartSleeper(t).Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	gone := txn.Proc{PID: live.PID, Start: live.Start + 1} // the PID, reused by another process
	if err := resumeContainer(ctx, &txn.Container{ID: "web", Runtime: fakeRuntime(t, "running")}, []txn.Proc{live}); err != nil {
		t.Errorf("rollback of a running container: %v, want done", err)
	}
	for _, status := range []string{"stopped", "paused"} {
		if err := resumeContainer(ctx, &txn.Container{ID: "web", Runtime: fakeRuntime(t, status)}, []txn.Proc{gone}); err != nil {
			t.Errorf("rollback of a %s container whose processes are gone: %v, want done", status, err)
		}
	}
	if err := resumeContainer(ctx, &txn.Container{ID: "web"}, []txn.Proc{gone}); err != nil {
		t.Errorf("rollback with no runtime recorded, processes gone: %v, want done", err)
	}
	err = resumeContainer(ctx, &txn.Container{ID: "web", Runtime: fakeRuntime(t, "paused")}, []txn.Proc{gone, live})
	if err == nil || !strings.Contains(err.Error(), "container web is left paused") || !strings.Contains(err.Error(), "container not paused") {
		t.Errorf("rollback of a container the runtime cannot resume: %v, want it named as left paused", err)
	}
}
