package criu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

func driver(t *testing.T) *Driver {
	t.Helper()
	d, err := Find(os.Getenv("GPUCR_CRIU"))
	if err == nil && os.Geteuid() == 0 {
		return d
	}
	testutil.SkipOrFail(t, fmt.Sprintf("needs root and CRIU: %v", err))
	return nil
}

// The plugin directory and plugin settings reach CRIU's process, and only it.
func TestDumpPassesPluginDirAndEnv(t *testing.T) {
	d := driver(t)
	pluginDir := filepath.Join(filepath.Dir(filepath.Dir(d.Path)), "lib", "amdgpu")
	if _, err := os.Stat(filepath.Join(pluginDir, "amdgpu_plugin.so")); err != nil {
		testutil.SkipOrFail(t, err.Error())
	}
	cmd := testutil.StartSleeper(t)
	dir := t.TempDir()
	err := d.Dump(context.Background(), DumpRequest{
		PID: cmd.Process.Pid, ImagesDir: dir, WorkDir: dir, LeaveRunning: true,
		Options: Options{LogLevel: 4, PluginDir: pluginDir, Env: []string{"KFD_MAX_BUFFER_SIZE=2G"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	log, _ := os.ReadFile(filepath.Join(dir, DumpLog))
	for _, want := range []string{"amdgpu_plugin: initialized", "KFD_MAX_BUFFER_SIZE:0x80000000"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("dump log lacks %q", want)
		}
	}
	if os.Getenv("CRIU_LIBS_DIR") != "" || os.Getenv("KFD_MAX_BUFFER_SIZE") != "" {
		t.Error("the plugin settings leaked into gpucr's own environment")
	}
}

func TestValidateNetworkLock(t *testing.T) {
	for _, m := range []string{"", "nftables", "iptables", "skip"} {
		if err := ValidateNetworkLock(m); err != nil {
			t.Errorf("%q: %v", m, err)
		}
	}
	if err := ValidateNetworkLock("ufw"); err == nil {
		t.Error("ufw accepted")
	}
}

// A restore runs with what the dump needed plus what the user adds, for process trees and
// containers alike; the network is unlocked as the dump locked it unless the user says.
func TestFlagsForRestore(t *testing.T) {
	dumped := Flags{TCPEstablished: true, NetworkLock: "iptables"}
	if got := dumped.ForRestore(Flags{}); got != dumped {
		t.Fatalf("restore with no flags of its own = %+v, want the dump's %+v", got, dumped)
	}
	got := dumped.ForRestore(Flags{ShellJob: true, NetworkLock: "skip"})
	want := Flags{ShellJob: true, TCPEstablished: true, NetworkLock: "skip"}
	if got != want {
		t.Fatalf("ForRestore = %+v, want %+v", got, want)
	}
}
