package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/gpu/nvidia"
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

// The CRIU action opens the backends with the CRIU gpucr would run, beside which gpucr's
// CRIU plugin lies: opened with none, the NVIDIA backend never found the plugin, and a
// runtime's dump of a container with a forked DataLoader worker was refused saying to
// install it, where the action refuses it saying to checkpoint with gpucr.
func TestActionFindsTheCRIUPlugin(t *testing.T) {
	prefix := t.TempDir()
	for _, f := range []string{filepath.Join("sbin", "criu"), filepath.Join("lib", "nvidia", nvidia.FilePluginFile)} {
		testutil.WriteFile(t, filepath.Join(prefix, f), nil)
		if err := os.Chmod(filepath.Join(prefix, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", filepath.Join(prefix, "sbin"))
	a := &app{criuPath: "criu"}
	cfg := a.actionGPUConfig()
	if got, want := nvidia.FindFilePlugin(cfg.CRIU), filepath.Join(prefix, "lib", "nvidia"); got != want {
		t.Fatalf("the action's backends open with CRIU %q, beside which the plugin is %q; want %q", cfg.CRIU, got, want)
	}
}
