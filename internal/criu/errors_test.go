package criu

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A restore of a network namespace on a host without iptables logs CRIU's probe for each
// variant as an error and goes on; the cause of a failure is what comes after.
func TestErrorLinesSkipCRIUsProbes(t *testing.T) {
	log := filepath.Join(t.TempDir(), RestoreLog)
	lines := []string{
		"Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted",
		`Error (criu/util.c:641): execvp("iptables-restore", ...) failed: No such file or directory`,
		"     1: Error (criu/util.c:1722): iptables-restore -V failed",
		`Error (criu/util.c:641): execvp("ip6tables-legacy-restore", ...) failed: No such file or directory`,
		"     1: Error (criu/util.c:1722): ip6tables-legacy-restore -V failed",
		"Error (criu/files-reg.c:2148): Can't open file tmp/data/x on restore: No such file or directory",
		"Error (criu/cr-restore.c:2320): Restoring FAILED.",
	}
	if err := os.WriteFile(log, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := errorLines(log); !slices.Equal(got, lines[5:]) {
		t.Errorf("errorLines = %q, want %q", got, lines[5:])
	}
}

// A dump whose task died as CRIU seized it logs the cause as a warning, then nft's complaint
// as CRIU removes its network lock: the error named nft's line (hostile test).
func TestErrorLinesNameATaskCRIUCouldNotInterrupt(t *testing.T) {
	log := filepath.Join(t.TempDir(), "dump.log")
	lines := []string{
		"(00.021000) Warn  (compel/src/lib/infect.c:129): Unable to interrupt task: 4242 (Operation not permitted)",
		"Error: Could not process rule: No such file or directory",
		"(00.030000) Error (criu/cr-dump.c:2100): Dumping FAILED.",
	}
	if err := os.WriteFile(log, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := errorLines(log); !slices.Equal(got, []string{lines[0], lines[2]}) {
		t.Errorf("errorLines = %q, want the task CRIU could not interrupt first", got)
	}
}

// CRIU warns that it cannot interrupt a zombie, and carries on: a real cause after that
// warning is the one named (review).
func TestErrorLinesNameTheCauseNotAZombiesWarning(t *testing.T) {
	log := filepath.Join(t.TempDir(), "dump.log")
	lines := []string{
		"(00.021000) Warn  (compel/src/lib/infect.c:133): Unable to interrupt task: 9787 (Operation not permitted)",
		"(00.030000) Error (criu/sk-inet.c:188): inet: Connected TCP socket, consider using --tcp-established option.",
	}
	if err := os.WriteFile(log, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := errorLines(log); !slices.Equal(got, lines[1:]) {
		t.Errorf("errorLines = %q, want the error after the warning", got)
	}
}

// When gpucr's own answer to a notification ended the run, that is the cause the error
// names, not the lines CRIU logged as it gave up.
func TestErrorNamesGpucrsOwnFailureFirst(t *testing.T) {
	own := &Error{Op: "restore", LogPath: "restore.log", Lines: []string{"Error (criu/action-scripts.c:156): One of more action scripts failed"},
		Err: &NotifyError{Script: "post-restore", Err: errors.New("memory fill: process 7 is gone")}}
	if got := own.Error(); !strings.HasPrefix(got, "criu restore failed: post-restore: memory fill: process 7 is gone") {
		t.Errorf("Error() = %q, want gpucr's post-restore failure named", got)
	}
	crius := &Error{Op: "restore", LogPath: "restore.log", Lines: []string{"Error (x.c:1): bad"}, Err: errors.New("operation failed")}
	if got := crius.Error(); !strings.HasPrefix(got, "criu restore failed: Error (x.c:1): bad") {
		t.Errorf("Error() = %q, want CRIU's first line", got)
	}
}

// CRIU's failure to make a semaphore's link, its name taken, says what is in the way and
// what to do: CRIU named the semaphore's temporary path alone (hostile test).
func TestHintForATakenLinkRemap(t *testing.T) {
	line := "(00.051234) Error (criu/files-reg.c:1159): Can't link remap to /dev/shm/sem.Pb6OCi: File exists"
	if h := hintFor(line); !strings.Contains(h, "link_remap") || !strings.Contains(h, "/dev/shm") {
		t.Fatalf("hint %q, want the link in the way named", h)
	}
	if h := hintFor("(00.1) Error (criu/files-reg.c:1159): Can't link remap to /x: Permission denied"); h != "" {
		t.Fatalf("hint %q for another failure", h)
	}
}
