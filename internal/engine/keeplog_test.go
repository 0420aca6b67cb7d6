package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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

// A failure keeps its CRIU log, and no more than the newest keptLogs of this user's: every
// failed run kept one for good, and a test host had a thousand (hostile test). Another
// user's logs stay.
func TestKeptLogsArePruned(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	old := time.Now().Add(-time.Hour)
	for i := range keptLogs + 5 {
		p := filepath.Join(tmp, fmt.Sprintf("gpucr-criu-%03d.log", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(tmp, "gpucr-criu-other.log")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	work := t.TempDir()
	log := filepath.Join(work, "dump.log")
	if err := os.WriteFile(log, []byte("(00.1) Error (criu/cr-dump.c:1): boom\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := keepLog(criu.LogError("dump", log, errors.New("criu dump failed")))
	var ce *criu.Error
	if !errors.As(err, &ce) {
		t.Fatal(err)
	}
	kept, _ := filepath.Glob(filepath.Join(tmp, "gpucr-criu-*.log"))
	mine := slices.DeleteFunc(slices.Clone(kept), func(p string) bool { return p == other })
	if len(mine) != keptLogs || !slices.Contains(mine, ce.LogPath) {
		t.Fatalf("%d of this user's logs kept (the new %s among them: %v), want %d", len(mine), ce.LogPath, slices.Contains(mine, ce.LogPath), keptLogs)
	}
	if os.Geteuid() == 0 && !slices.Contains(kept, other) {
		t.Fatal("another user's log was removed")
	}
	if slices.Contains(kept, filepath.Join(tmp, "gpucr-criu-000.log")) {
		t.Fatal("the oldest log was kept")
	}
}

// A CRIU that failed before it wrote its log is named with no log: the error named a path
// CRIU never wrote (review).
func TestNoLogIsNamedWhereCRIUWroteNone(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	missing := filepath.Join(t.TempDir(), "restore.log")
	err := fmt.Errorf("%w; the image is unchanged", criu.LogError("restore", missing, errors.New("operation failed (msg: err:56)")))
	got := keepLog(err)
	if msg := got.Error(); strings.Contains(msg, missing) || !strings.Contains(msg, "(CRIU wrote no log)") || !strings.HasSuffix(msg, "the image is unchanged") {
		t.Fatalf("error %q", msg)
	}
	var ce *criu.Error
	if !errors.As(got, &ce) || ce.LogPath != "" {
		t.Fatalf("the CRIU error is lost or names %v", ce)
	}
}
