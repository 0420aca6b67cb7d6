package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// keygen at a path that is taken, or in a directory that does not exist, is a request to
// fix: exit 2, one line naming the path and what to do, with --json the same as JSON. It
// said "write key /d/k: link /d/.k.tmp-1501451106 /d/k: file exists" (exit 1), naming a
// temporary file of its own (UX review).
func TestKeygenRefusesATakenPathInOneLine(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "k")
	var stdout, stderr strings.Builder
	if code := run([]string{"keygen", key}, &stdout, &stderr); code != 0 {
		t.Fatalf("keygen: exit %d: %s", code, stderr.String())
	}
	pubOnly := filepath.Join(dir, "p")
	if err := os.WriteFile(pubOnly+".pub", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ path, want string }{
		{key, key + " already exists"},
		{pubOnly, pubOnly + ".pub already exists"},
		{dir, dir + " already exists"},
		{filepath.Join(dir, "nope", "k"), "directory " + filepath.Join(dir, "nope") + " does not exist"},
		{filepath.Join(key, "k"), key + " is not a directory"},
	} {
		stdout.Reset()
		stderr.Reset()
		code := run([]string{"keygen", "--json", tt.path}, &stdout, &stderr)
		msg := stderr.String()
		if code != exitUsage || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, tt.want) || strings.Contains(msg, ".tmp-") {
			t.Errorf("keygen %s: exit %d, want %d and one line with %q, no temporary file:\n%s", tt.path, code, exitUsage, tt.want, msg)
		}
		var e errorOutput
		if err := json.Unmarshal([]byte(stdout.String()), &e); err != nil || e.ExitCode != exitUsage || !strings.Contains(e.Error, tt.want) {
			t.Errorf("keygen --json %s: stdout %q (%v), want the error as JSON", tt.path, stdout.String(), err)
		}
	}
	if _, err := os.Stat(pubOnly); !os.IsNotExist(err) {
		t.Errorf("a refused keygen left %s (%v)", pubOnly, err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) > 0 {
		t.Errorf("keygen left temporary files: %v", left)
	}
}
