package container

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/txn"
)

// fakeRunc writes a runc that logs each command it is given to a file and answers as
// status says the container is; pause fails after "freezing" it when pauseFails.
func fakeRunc(t *testing.T, status string, pauseFails bool) (path, calls string) {
	t.Helper()
	dir := t.TempDir()
	calls = filepath.Join(dir, "calls")
	pause := "exit 0"
	if pauseFails {
		pause = `echo "saving state: no space left on device" >&2; exit 1`
	}
	script := `#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in --log|--log-format|--root|--criu) shift 2;; *) break;; esac; done
echo "$1" >> ` + calls + `
case "$1" in
pause) ` + pause + `;;
resume) [ "` + status + `" = paused ] || { echo "container not paused" >&2; exit 1; };;
state) echo '{"id":"web","pid":1,"status":"` + status + `"}';;
esac
`
	path = filepath.Join(dir, "runc")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, calls
}

// A runc pause that froze the container and then failed left no resume in the rollback:
// the container stayed paused for good (review). The resume is the rollback's before the
// pause; and a container runc says is running needs none, which the rollback does not
// report as left paused.
func TestFailedPauseIsResumedByTheRollback(t *testing.T) {
	ctx := context.Background()
	e := &engine.Engine{Version: "test"}
	for _, status := range []string{"paused", "running", "stopped"} {
		runc, calls := fakeRunc(t, status, true)
		op, err := e.Begin(txn.OpCheckpoint, "container web")
		if err != nil {
			t.Fatal(err)
		}
		target := (&Containers{Engine: e, Runc: &Runc{Path: runc}}).Target("web")
		var undo engine.Undo
		_, err = target.Freeze(ctx, op, &undo)
		if err == nil {
			t.Fatal("Freeze succeeded with a failing pause")
		}
		if err := undo.Unwind(ctx, err); strings.Contains(err.Error(), "also failed") {
			t.Errorf("container %s: rollback: %v", status, err)
		}
		op.End()
		b, _ := os.ReadFile(calls)
		if got := strings.Fields(string(b)); len(got) < 2 || got[0] != "pause" || got[1] != "resume" {
			t.Errorf("container %s: runc was run with %q, want pause then resume", status, got)
		}
	}
}

// runc's CRIU is told where the plugins a dump needs are (gpucr's NVIDIA plugin for a
// DataLoader worker's device files) through runc's environment, which runc passes on.
func TestRuncDumpNamesThePluginDirectory(t *testing.T) {
	dir := t.TempDir()
	seen := filepath.Join(dir, "seen")
	runc := filepath.Join(dir, "runc")
	if err := os.WriteFile(runc, []byte("#!/bin/sh\necho \"$CRIU_LIBS_DIR\" > "+seen+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	target := (&Containers{Engine: &engine.Engine{Version: "test"}, Runc: &Runc{Path: runc}}).Target("web")
	d := criu.DumpRequest{ImagesDir: t.TempDir(), WorkDir: t.TempDir(), Options: criu.Options{PluginDir: "/opt/gpucr/criu/lib/nvidia"}}
	if err := target.Dump(context.Background(), d, engine.DumpHooks{Frozen: func() {}, Commit: func() error { return nil }}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(seen); err != nil || strings.TrimSpace(string(b)) != "/opt/gpucr/criu/lib/nvidia" {
		t.Fatalf("runc's CRIU_LIBS_DIR = %q, %v; want the plugin directory", b, err)
	}
}
