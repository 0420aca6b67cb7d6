package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/gpucr/gpucr/internal/archive"
	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/testutil"
)

// A container ID becomes a runtime's state directory and a lock that a failed restore
// removes: one that is a path, "." or ".." is refused before anything is read or touched
// (a hostile test had `restore --new-id ..` remove the runtime root's parent).
func TestContainerIDsThatArePathsAreRefused(t *testing.T) {
	victim := t.TempDir()
	if err := os.WriteFile(filepath.Join(victim, "file"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel("/run/runc", victim)
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"restore", "-D", victim, "--container", "c1", "--new-id", ".."},
		{"restore", "-D", victim, "--container", "c1", "--new-id", "."},
		{"restore", "-D", victim, "--container", "c1", "--new-id", rel},
		{"restore", "-D", victim, "--container", "a/b"},
		{"checkpoint", "--container", "../x", "-D", filepath.Join(victim, "img")},
	} {
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), "is not a container ID") {
			t.Errorf("gpucr %s: exit %d, want %d naming the ID:\n%s", strings.Join(args, " "), code, exitUsage, stderr.String())
		}
	}
	if b, err := os.ReadFile(filepath.Join(victim, "file")); err != nil || string(b) != "kept" {
		t.Fatalf("the directory an ID named was touched: %q, %v", b, err)
	}
}

// The spec an export copies is its bundle's config.json, which the bundle's owner may have
// replaced once the container ran: a FIFO held root's gpucr in open(2) for good, with the
// container already removed, and a symlink had it copy whatever it named (hostile test).
// Each is refused at once in one line; a plain config.json is copied.
func TestExportReadsOnlyTheBundlesOwnSpec(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(outside, []byte(`{"token":"root's"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, plant := range map[string]func(string) error{
		"fifo":    func(p string) error { return syscall.Mkfifo(p, 0o600) },
		"symlink": func(p string) error { return os.Symlink(outside, p) },
		"regular": func(p string) error { return os.WriteFile(p, []byte(`{"ociVersion":"1.0.2"}`), 0o600) },
	} {
		t.Run(name, func(t *testing.T) {
			bundle, img := t.TempDir(), t.TempDir()
			if err := plant(filepath.Join(bundle, "config.json")); err != nil {
				t.Fatal(err)
			}
			info, _ := json.Marshal(container.Info{ID: "c1", Bundle: bundle})
			if err := os.WriteFile(filepath.Join(img, container.InfoName), info, 0o600); err != nil {
				t.Fatal(err)
			}
			type result struct {
				e   archive.Export
				err error
			}
			done := make(chan result, 1)
			go func() {
				e, err := exportOf(img, "runc", &image.Manifest{})
				done <- result{e, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the export still waits on the bundle's config.json")
			}
			if name == "regular" {
				if r.err != nil || !strings.Contains(string(r.e.Spec), "1.0.2") {
					t.Fatalf("spec %q, %v", r.e.Spec, r.err)
				}
				return
			}
			if r.err == nil || strings.Contains(string(r.e.Spec), "root's") || strings.Contains(r.err.Error(), "\n") {
				t.Fatalf("a %s config.json: spec %q, error %v; want one line refusing it", name, r.e.Spec, r.err)
			}
		})
	}
}

// The files a checkpoint left running holds open for output are named by the job: a
// container's workload held one whose name set root's terminal title and printed a line of
// its own ("  signed  by key ...") in the checkpoint's summary (hostile test). The name is
// shown with its control characters as '?', and no command to paste is offered for it.
func TestCheckpointOutputLinesReachNoTerminal(t *testing.T) {
	var stdout bytes.Buffer
	name := "/a\x1b]0;PWNED\a\n  signed  by key deadbeef"
	printCheckpoint(&app{stdout: &stdout}, checkpointOutput{RootPID: 42, Outputs: []outputFile{{Path: name, Size: 12}, {Path: "/log", Size: 3}}}, nil)
	out := stdout.String()
	if strings.ContainsFunc(strings.ReplaceAll(out, "\n", ""), unicode.IsControl) || strings.Contains(out, "\n  signed") {
		t.Fatalf("the job's file name reached the terminal:\n%q", out)
	}
	if !strings.Contains(out, "truncate -s 3 /log)") || strings.Contains(out, "truncate -s 12") {
		t.Fatalf("the truncate commands offered:\n%s", out)
	}
}

// A container's output file is named from the container's root: a truncate command for it,
// pasted on the host, truncates the host's file of that name. A workload that held its own
// /etc/passwd open for output had root told to run `truncate -s 8 /etc/passwd` (hostile
// test). The line says what to truncate and where, with no command.
func TestContainerOutputLinesOfferNoHostCommand(t *testing.T) {
	var stdout bytes.Buffer
	printCheckpoint(&app{stdout: &stdout}, checkpointOutput{Container: "c1", Outputs: []outputFile{{Path: "/etc/passwd", Size: 8}}}, nil)
	if out := stdout.String(); strings.Contains(out, "truncate -s") || !strings.Contains(out, "to 8 bytes in the container") {
		t.Fatalf("the output line of a container's file:\n%s", out)
	}
}

// A bundle's owner can point the bundle's path elsewhere once the container runs, through a
// symlink of theirs: at a root-only directory with a config.json (root's registry
// credentials in /root/.docker), which root's export copied into the archive (hostile test).
// A bundle reached through a user's symlink is refused.
func TestExportFollowsNoUsersSymlinkToTheBundle(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root: the symlink must be another user's")
	}
	secret, home := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(secret, "config.json"), []byte(`{"auths":"root's"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(home, "bundle")
	if err := os.Symlink(secret, bundle); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(bundle, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	img := t.TempDir()
	info, _ := json.Marshal(container.Info{ID: "c1", Bundle: bundle})
	if err := os.WriteFile(filepath.Join(img, container.InfoName), info, 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := exportOf(img, "runc", &image.Manifest{})
	if err == nil || strings.Contains(string(e.Spec), "root's") {
		t.Fatalf("a bundle through a user's symlink: spec %q, error %v; want it refused", e.Spec, err)
	}
}

// The journal records the runc command line a recovery runs, from wherever that runs: a
// --runc-root given relative (rr) had gpucr recover, run from another directory, find no
// container to resume, the record failing every recover and the container left paused
// (hostile test: gpucr and its guardian killed together while the container was paused).
// The root and the runc binary are made absolute before anything is recorded.
func TestRuncRootAndBinaryAreAbsolute(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	runc, err := exec.LookPath("runc")
	if err != nil {
		testutil.SkipOrFail(t, "no runc")
	}
	if err := os.Symlink(runc, filepath.Join(dir, "myrunc")); err != nil {
		t.Fatal(err)
	}
	f := runcFlags{path: "./myrunc", root: "rr"}
	path, err := findRunc(&f)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, "myrunc") || f.root != filepath.Join(dir, "rr") {
		t.Fatalf("runc %q, root %q; want both absolute, under %s", path, f.root, dir)
	}
}
