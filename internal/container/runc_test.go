package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/testutil"
)

// A runc checkpoint or restore whose CRIU failed quotes CRIU's first error line and names
// its log as a criu.Error, which the engine copies out before the work directory goes:
// runc's own message named only the log in the work directory, found gone (tester's report).
func TestRuncCRIUFailureQuotesCRIUsLog(t *testing.T) {
	// A stand-in runc that fails as runc does when its CRIU fails: CRIU's log in the work
	// directory, and runc's error, naming it, in its --log file.
	fake := filepath.Join(t.TempDir(), "runc")
	script := `#!/bin/sh
while [ $# -gt 0 ]; do
	case $1 in
	--log) log=$2; shift ;;
	--work-path) work=$2; shift ;;
	checkpoint) op=dump ;;
	restore) op=restore ;;
	esac
	shift
done
echo "$CAUSE" > "$work/$op.log"
printf '{"level":"error","msg":"criu failed: type NOTIFY errno 0\\nlog file: %s"}\n' "$work/$op.log" > "$log"
exit 1
`
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Runc{Path: fake}
	for _, cause := range []string{"(00.01) Error (criu/files-reg.c:1790): the cause", "no error line"} {
		env := []string{"CAUSE=" + cause}
		for op, run := range map[string]func(work string) error{
			"dump": func(work string) error {
				return r.Checkpoint(context.Background(), "c", t.TempDir(), work, criu.Flags{}, env, "")
			},
			"restore": func(work string) error {
				return r.Restore(context.Background(), "c", t.TempDir(), t.TempDir(), work, criu.Flags{}, env, nil)
			},
		} {
			work := t.TempDir()
			err := run(work)
			want := "the cause"
			if cause == "no error line" {
				want = "criu failed: type NOTIFY errno 0"
			}
			var ce *criu.Error
			if !errors.As(err, &ce) || ce.LogPath != filepath.Join(work, op+".log") || !strings.Contains(err.Error(), want) ||
				strings.Contains(err.Error(), "log file:") {
				t.Errorf("%s: %v, want a criu.Error saying %q, naming %s/%s.log once", op, err, want, work, op)
			}
		}
	}
}

// A gpucr killed during a runc call left runc's log, named in TMPDIR, where no recovery
// looks (crash test): the log has no name there while runc runs, and runc's error, logged
// to it, is still what the call reports.
func TestRuncLogHasNoNameInTMPDIR(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	seen := filepath.Join(t.TempDir(), "seen")
	fake := filepath.Join(t.TempDir(), "runc")
	script := `#!/bin/sh
[ "$1" = --log ] || exit 2
ls -A "$TMPDIR" > ` + seen + `
printf '{"level":"error","msg":"container c does not exist"}\n' >> "$2"
exit 1
`
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := (&Runc{Path: fake}).State(context.Background(), "c")
	if err == nil || !strings.Contains(err.Error(), "container c does not exist") {
		t.Fatalf("runc state: %v, want runc's logged error", err)
	}
	b, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 {
		t.Errorf("TMPDIR held %q while runc ran", b)
	}
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Errorf("TMPDIR holds %v after the call", left)
	}
}

// A runc restore whose CRIU is a zombie is killed as waiting for good only while runc still
// holds its end of CRIU's seqpacket socket. runc whose CRIU failed on its own leaves the
// restored root (its child, named criu) unreaped while it runs its poststop hooks: one
// slower than criuGoneGrace was killed, and CRIU's error replaced by "died without an
// answer" (review).
func TestUnstickSparesARuncNoLongerTalkingToCRIU(t *testing.T) {
	if _, err := exec.LookPath("perl"); err != nil {
		testutil.SkipOrFail(t, "no perl")
	}
	dir := t.TempDir()
	if err := os.Symlink("/bin/true", filepath.Join(dir, "criu")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		socket string // perl that opens (or not) a seqpacket socket pair
		died   bool
	}{
		{"closed", "", false},
		{"held", "socketpair(my $a, my $b, AF_UNIX, SOCK_SEQPACKET, 0) or die;", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A stand-in runc: a child named criu that exits unreaped, then runc busy (a
			// poststop hook) for longer than criuGoneGrace, then failing.
			fake := filepath.Join(t.TempDir(), "runc")
			script := "#!/usr/bin/perl\nuse Socket;\n" + c.socket + "\n" +
				"if (fork() == 0) { exec { \"" + filepath.Join(dir, "criu") + "\" } \"criu\"; exit 1; }\n" +
				"sleep 1 while time() - $^T < " + fmt.Sprint(int((criuGoneGrace+time.Second)/time.Second)+1) + ";\nexit 1;\n"
			if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			r := &Runc{Path: fake}
			err := r.Restore(context.Background(), "c", t.TempDir(), t.TempDir(), t.TempDir(), criu.Flags{}, nil, nil)
			if errors.Is(err, errCRIUDied) != c.died {
				t.Fatalf("runc restore: %v; want CRIU taken for killed: %v", err, c.died)
			}
		})
	}
}

// A restored root that dies while runc's CRIU goes on (the OOM killer, mid-restore) is a
// zombie child of runc's named criu too: only runc's oldest criu child is its CRIU, and a
// runc whose CRIU still runs is not killed as waiting for good (review).
func TestUnstickSparesARuncWhoseCRIURunsOn(t *testing.T) {
	if _, err := exec.LookPath("perl"); err != nil {
		testutil.SkipOrFail(t, "no perl")
	}
	running, exiting := t.TempDir(), t.TempDir()
	for dir, prog := range map[string]string{running: "/bin/sleep", exiting: "/bin/true"} {
		if err := os.Symlink(prog, filepath.Join(dir, "criu")); err != nil {
			t.Fatal(err)
		}
	}
	// A stand-in runc holding a seqpacket socket, its CRIU running, and a younger child
	// named criu that exits unreaped, past criuGoneGrace.
	fake := filepath.Join(t.TempDir(), "runc")
	script := "#!/usr/bin/perl\nuse Socket;\nsocketpair(my $a, my $b, AF_UNIX, SOCK_SEQPACKET, 0) or die;\n" +
		"my $criu = fork(); if ($criu == 0) { exec { \"" + filepath.Join(running, "criu") + "\" } \"criu\", \"30\"; exit 1; }\n" +
		"select(undef, undef, undef, 0.05);\n" +
		"if (fork() == 0) { exec { \"" + filepath.Join(exiting, "criu") + "\" } \"criu\"; exit 1; }\n" +
		"sleep 1 while time() - $^T < " + fmt.Sprint(int((criuGoneGrace+time.Second)/time.Second)+1) + ";\nkill 'KILL', $criu;\nexit 1;\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	err := (&Runc{Path: fake}).Restore(context.Background(), "c", t.TempDir(), t.TempDir(), t.TempDir(), criu.Flags{}, nil, nil)
	if err == nil || errors.Is(err, errCRIUDied) {
		t.Fatalf("runc restore: %v; want runc's own failure, its CRIU never taken for killed", err)
	}
}

// A restore checks the image's PIDs against the host's only for a container in the host's
// PID namespace: one that joins another container's numbers them as that one does, and
// its PID 21 was taken for the host's kernel thread of that number (hostile test).
func TestInHostPIDNamespaceReadsTheBundle(t *testing.T) {
	for spec, want := range map[string]bool{
		`{"linux":{"namespaces":[{"type":"mount"}]}}`:                                      true,
		`{"linux":{"namespaces":[{"type":"pid"},{"type":"mount"}]}}`:                       false,
		`{"linux":{"namespaces":[{"type":"pid","path":"/proc/7/ns/pid"},{"type":"ipc"}]}}`: false,
	} {
		bundle := t.TempDir()
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(spec), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := inHostPIDNamespace(bundle); err != nil || got != want {
			t.Errorf("%s: %v, %v; want %v", spec, got, err, want)
		}
	}
}
