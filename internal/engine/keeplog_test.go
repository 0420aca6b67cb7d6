package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/criu"
)

// A failed container restore's CRIU error comes back wrapped by the removal of the
// half-made container ("...; the restored container X was removed"), whose message was
// written while the log was still in the work directory: the copy kept in TMPDIR was named
// nowhere, and the error named the log the restore then removed (crash test, runc killed on
// its own). The error names the kept copy, however it was wrapped.
func TestKeptLogIsNamedThroughAWrappedError(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	work := t.TempDir()
	log := filepath.Join(work, "restore.log")
	if err := os.WriteFile(log, []byte("(00.1) Error (criu/cr-restore.c:1): boom\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := fmt.Errorf("%w; the restored container c was removed, the image is unchanged",
		fmt.Errorf("%w: the hook said no", criu.LogError("restore", log, errors.New("runc restore: signal: killed"))))
	got := keepLog(err)
	kept, _ := filepath.Glob(filepath.Join(tmp, "gpucr-criu-*.log"))
	if len(kept) != 1 {
		t.Fatalf("kept logs %v", kept)
	}
	if msg := got.Error(); strings.Contains(msg, log) || !strings.Contains(msg, kept[0]) || !strings.HasSuffix(msg, "the image is unchanged") {
		t.Fatalf("error %q names %s, not the kept %s", msg, log, kept[0])
	}
	var ce *criu.Error
	if !errors.As(got, &ce) || ce.LogPath != kept[0] {
		t.Fatalf("the CRIU error is lost or names %v", ce)
	}
}
