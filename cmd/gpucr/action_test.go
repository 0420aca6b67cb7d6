package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/testutil"
)

// install-criu-integration --json prints one document, as every verb does (docs/json.md);
// it printed its text lines.
func TestInstallIntegrationJSON(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "the integration installs only into a directory only root can change")
	}
	dir := t.TempDir()
	flags := []string{"install-criu-integration", "--json", "--config", filepath.Join(dir, "runc.conf"), "--crun-config", "",
		"--script", filepath.Join(dir, "lib", "criu-action"), "--log", filepath.Join(dir, "action.log"), "--state-dir", filepath.Join(dir, "state")}
	var installed installOutput
	decodeOne(t, flags, &installed)
	if installed.Binary != filepath.Join(dir, "lib", "gpucr") || len(installed.Configs) != 1 {
		t.Errorf("install --json: %+v", installed)
	}
	var removed container.Removal
	decodeOne(t, append(flags, "--remove"), &removed)
	if len(removed.Removed) != 3 || removed.Removed[0] != filepath.Join(dir, "runc.conf") { // the configuration file, the script, gpucr's copy
		t.Errorf("install --remove --json: %+v", removed)
	}
}

// decodeOne runs gpucr with args and decodes its stdout, which must be one JSON document,
// into v.
func decodeOne(t *testing.T, args []string, v any) {
	t.Helper()
	var stdout, stderr strings.Builder
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("gpucr %s: exit %d: %s", strings.Join(args, " "), code, stderr.String())
	}
	dec := json.NewDecoder(strings.NewReader(stdout.String()))
	if err := dec.Decode(v); err != nil || dec.More() {
		t.Fatalf("gpucr %s: stdout is not one JSON document (%v):\n%s", strings.Join(args, " "), err, stdout.String())
	}
}
