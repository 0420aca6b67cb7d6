package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
