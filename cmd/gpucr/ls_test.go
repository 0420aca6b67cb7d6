package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/safety"
)

// ls's table writes sizes in binary units a reader takes in at a glance, not byte counts.
func TestLsTableWritesReadableSizes(t *testing.T) {
	var b strings.Builder
	printLs(&b, []lsEntry{
		{URL: "s3://b/ckpt", Created: time.Unix(0, 0), Host: "h", Processes: 2, RootPID: 7,
			MemoryBytes: 64 << 20, StoredBytes: 3 << 29},
		{URL: "s3://b/broken", Problem: "manifest.json: unexpected end of JSON input"},
	})
	out := b.String()
	for _, want := range []string{"64 MiB", "1.5 GiB", "2 (root 7)", "s3://b/broken  unusable: manifest.json"} {
		if !strings.Contains(out, want) {
			t.Errorf("ls table lacks %q:\n%s", want, out)
		}
	}
}

// What a store holds is anyone's who can write it: ls and gpucr's errors show it without
// its control characters (a hostile test set the terminal's title, cleared the screen and
// printed a line of its own through a manifest object's hostname and a lease's name).
func TestStoreTextReachesNoTerminal(t *testing.T) {
	const hostile = "h\x1b]0;PWNED\x07\x1b[2J\nverified: signed by trusted key 0123"
	var b strings.Builder
	printLs(&b, []lsEntry{
		{URL: "s3://b/" + hostile, Created: time.Unix(0, 0), Host: hostile, Processes: 1, RootPID: 7},
		{URL: "s3://b/broken", Problem: hostile},
	})
	checkNoControl(t, "ls", b.String(), 3)

	var stdout, stderr strings.Builder
	if code := run([]string{"inspect", "/nonexistent/" + hostile}, &stdout, &stderr); code == 0 {
		t.Fatalf("inspect of a missing image: exit 0")
	}
	checkNoControl(t, "an error", stderr.String(), 1)
}

// checkNoControl fails t if out holds a control character other than tab and the newline
// ending each of its lines lines.
func checkNoControl(t *testing.T, what, out string, lines int) {
	t.Helper()
	if n := strings.Count(out, "\n"); n != lines {
		t.Errorf("%s: %d lines, want %d:\n%q", what, n, lines, out)
	}
	if i := strings.IndexFunc(out, func(r rune) bool { return r != '\n' && r != '\t' && unicode.IsControl(r) }); i >= 0 {
		t.Errorf("%s passes a control character on: %q", what, out)
	}
}

// ls and gc of a local directory that is not there say so, instead of listing nothing or
// creating it to collect (a hostile test's gc made the mistyped path and reported 0 chunks
// removed): a mistyped path must not look like an empty store.
func TestStoreVerbsOfAMissingDirectory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "gpucr-store")
	for _, verb := range []string{"ls", "gc"} {
		var stdout, stderr strings.Builder
		code := run([]string{verb, missing}, &stdout, &stderr)
		if code == 0 || !strings.Contains(stderr.String(), "no store at "+missing) {
			t.Fatalf("%s of a missing directory: exit %d, stdout %q, stderr %q", verb, code, stdout.String(), stderr.String())
		}
		if _, err := os.Stat(missing); err == nil {
			t.Fatalf("%s made the missing directory", verb)
		}
	}
}

// A failed CRIU action step's line on the engine's stderr (runc's, podman's) carries no
// control character of the image's: a crafted GPU record's backend name did.
func TestEngineLineReachesNoTerminal(t *testing.T) {
	err := fmt.Errorf("unknown GPU backend %q", "\x1b]0;PWNED\x07\x1b[31mRED\nsecond line")
	checkNoControl(t, "the engine's line", engineLine(err)+"\n", 1)
}

// --dry-run shows a process's name and the paths it holds, which are its user's to choose,
// without their control characters: a hostile test's process name drove root's terminal.
func TestDryRunReachesNoTerminal(t *testing.T) {
	const hostile = "\x1b]2;PWNED\x07\x1b[2J\nfix: nothing"
	var b strings.Builder
	printAnalysis(&b, &engine.Analysis{Processes: 1, Findings: []safety.Finding{
		{Check: "io-uring", PID: 7, Command: hostile, Reason: "holds " + hostile, Fix: "stop " + hostile}}})
	checkNoControl(t, "--dry-run", b.String(), 3)
}
