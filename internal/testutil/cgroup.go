package testutil

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FreezeInCgroup moves pid into a new cgroup and freezes it, as a container engine pauses
// a container: in cgroup v2 where the host has it (alone, or beside v1 on a hybrid host),
// else in v1's freezer hierarchy. It returns the cgroup's directory; when the test ends
// the cgroup is thawed, pid moved back to the hierarchy's root and the cgroup removed.
func FreezeInCgroup(t testing.TB, pid int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "making cgroups needs root")
	}
	top, file, frozen, thawed := "", "", "", ""
	for _, v2 := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if _, err := os.Stat(filepath.Join(v2, "cgroup.subtree_control")); err == nil {
			top, file, frozen, thawed = v2, "cgroup.freeze", "1", "0"
			break
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup/freezer/cgroup.procs"); top == "" && err == nil {
		top, file, frozen, thawed = "/sys/fs/cgroup/freezer", "freezer.state", "FROZEN", "THAWED"
	}
	if top == "" {
		SkipOrFail(t, "no cgroup freezer mounted")
	}
	dir := filepath.Join(top, "gpucr-test-"+strconv.Itoa(pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(dir, file), []byte(thawed), 0)
		_ = os.WriteFile(filepath.Join(top, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
		for range 100 {
			if os.Remove(dir) == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", dir)
	})
	for _, f := range [][2]string{{"cgroup.procs", strconv.Itoa(pid)}, {file, frozen}} {
		if err := os.WriteFile(filepath.Join(dir, f[0]), []byte(f[1]), 0); err != nil {
			t.Fatal(err)
		}
	}
	state, want := filepath.Join(dir, "cgroup.events"), "frozen 1"
	if file == "freezer.state" {
		state, want = filepath.Join(dir, "freezer.state"), "FROZEN"
	}
	for range 500 {
		if b, _ := os.ReadFile(state); strings.Contains(string(b), want) {
			return dir
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("cgroup %s never froze", dir)
	return ""
}
