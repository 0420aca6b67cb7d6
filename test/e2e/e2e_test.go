package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/testutil"
)

// These tests run the real gpucr binary against real CRIU on real process trees. They need
// root and CRIU >= 4.1 (make deps); under CI=true a missing prerequisite fails them.

var bin struct{ gpucr, counter string }

// testVersion is the version the binary under test is built with, as make stamps its own.
const testVersion = "e2e-test-build"

// Exit codes, as README and docs/json.md promise them.
const (
	exitFailed   = 1
	exitUsage    = 2
	exitNotReady = 3
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gpucr-e2e-bin-")
	if err != nil {
		panic(err)
	}
	_ = os.Chmod(dir, 0o755) // the not-root test runs the binary as nobody
	bin.gpucr, bin.counter = filepath.Join(dir, "gpucr"), filepath.Join(dir, "counter")
	builds := []struct {
		out, pkg string
		args     []string
		env      []string
	}{
		// The Makefile's ldflags: the version is what the manifest and --version report.
		{bin.gpucr, "github.com/gpucr/gpucr/cmd/gpucr", []string{"-ldflags", "-X main.version=" + testVersion}, nil},
		// Static: the counter also runs inside containers.
		{bin.counter, "github.com/gpucr/gpucr/test/workloads/counter", nil, []string{"CGO_ENABLED=0"}},
	}
	for _, b := range builds {
		build := exec.Command("go", append(append([]string{"build", "-o", b.out}, b.args...), b.pkg)...)
		build.Env = append(os.Environ(), b.env...)
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.pkg, err, out)
			os.Exit(1)
		}
	}
	// Restored trees are re-parented to the nearest subreaper: make that us, so the tests
	// can reap what they restore instead of leaving zombies that hold PIDs.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// The binary names the version it was built with, as the Makefile stamps it: a renamed
// version variable would leave -X with nothing to set, silently.
func TestVersionIsTheBuilds(t *testing.T) {
	out, code := gpucr(t, "--version")
	if code != 0 || !strings.HasPrefix(out, "gpucr version "+testVersion+",") {
		t.Fatalf("gpucr --version: exit %d: %q, want version %s", code, out, testVersion)
	}
}

// hostNotReady says why this host cannot run CRIU, or "" when it can; asked once per run.
var hostNotReady = sync.OnceValue(func() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	if out, err := exec.Command(bin.gpucr, "check").CombinedOutput(); err != nil {
		return fmt.Sprintf("gpucr check says the host is not ready (run make deps): %v\n%s", err, out)
	}
	return ""
})

// needCRIU skips (or under CI fails) when this host cannot run CRIU.
func needCRIU(t *testing.T) {
	t.Helper()
	if why := hostNotReady(); why != "" {
		testutil.SkipOrFail(t, why)
	}
}

// run runs the binary with env added to the test's own and returns its exit code (-1:
// killed by a signal).
func run(t *testing.T, env []string, stdout, stderr io.Writer, args ...string) int {
	t.Helper()
	cmd := exec.Command(bin.gpucr, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("run gpucr: %v", err)
	}
	return 0
}

// gpucr runs the binary and returns its stdout and stderr together, without progress lines,
// and its exit code.
func gpucr(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code := run(t, nil, &out, &out, args...)
	return withoutProgress(out.String()), code
}

func mustGpucr(t *testing.T, args ...string) string {
	t.Helper()
	out, code := gpucr(t, args...)
	if code != 0 {
		t.Fatalf("gpucr %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// gpucrEnv runs the binary with extra environment and returns its stdout, stderr and exit code.
func gpucrEnv(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(t, env, &stdout, &stderr, args...)
	return stdout.String(), stderr.String(), code
}

func mustGpucrEnv(t *testing.T, env []string, args ...string) string {
	t.Helper()
	out, errOut, code := gpucrEnv(t, env, args...)
	if code != 0 {
		t.Fatalf("gpucr %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// decode reads gpucr's --json output into v.
func decode(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
}

// oneLineWith reports whether gpucr's output is the one line a refusal must be, naming want.
func oneLineWith(out, want string) bool {
	out = withoutProgress(out)
	return strings.Contains(out, want) && !strings.Contains(strings.TrimSpace(out), "\n")
}

// withoutProgress is gpucr's output without the lines that log a long phase's progress when
// stderr is not a terminal (--progress-every): on a loaded machine a phase may take long
// enough to log some, before a refusal or beside a JSON document.
func withoutProgress(errOut string) string {
	var b strings.Builder
	for line := range strings.Lines(errOut) {
		if !strings.HasPrefix(line, "time=") || !strings.Contains(line, " level=INFO ") {
			b.WriteString(line)
		}
	}
	return b.String()
}
