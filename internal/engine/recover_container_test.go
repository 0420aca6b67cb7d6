package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
// runtime's failed dump resumed it) is the outcome wanted, not a failed rollback. One still
// paused is reported.
func TestRollbackResumesContainerUnlessItRuns(t *testing.T) {
	ctx := context.Background()
	if err := resumeContainer(ctx, &txn.Container{ID: "web", Runtime: fakeRuntime(t, "running")}); err != nil {
		t.Errorf("rollback of a running container: %v, want done", err)
	}
	err := resumeContainer(ctx, &txn.Container{ID: "web", Runtime: fakeRuntime(t, "paused")})
	if err == nil || !strings.Contains(err.Error(), "container web is left paused") || !strings.Contains(err.Error(), "container not paused") {
		t.Errorf("rollback of a container the runtime cannot resume: %v, want it named as left paused", err)
	}
}
