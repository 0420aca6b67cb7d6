package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

// A checkpoint killed with its whole process group — timeout -s KILL, kill -9 -PGID, a
// service manager's stop — loses no job: the workload runs on, or its checkpoint is complete.
// The kill lands a few milliseconds into the memory save, where CRIU is infecting the
// tree's tasks: a CRIU killed with gpucr there left the counter at CRIU's injected trap, and
// it died of SIGTRAP once released, with no checkpoint (the guardian's rollback found
// nothing wrong). gpucr alone killed at the same points always rolled back.
func TestCheckpointKilledWithItsProcessGroupLosesNoJob(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	for _, streamed := range []bool{true, false} {
		for _, ms := range []int{0, 2, 4, 8} {
			point := fmt.Sprintf("start memory-save+%dms", ms)
			name := fmt.Sprintf("-D, %s", point)
			if streamed {
				name = fmt.Sprintf("--to, %s", point)
			}
			t.Run(name, func(t *testing.T) {
				host, w, dir := crashSetup(t, drv)
				where := []string{"-D", dir}
				storeDir := t.TempDir()
				if streamed {
					dir = filepath.Join(storeDir, "ckpt")
					where = []string{"--to", dir}
				}
				args := append(append([]string{"checkpoint", strconv.Itoa(w.pid)}, where...), host.flags()...)
				cmd := exec.Command(bin.gpucr, args...)
				// The crash point kills gpucr's process group, which gpucr leads, as timeout's.
				cmd.Env = append(append(os.Environ(), drv.env...), "GPUCR_TEST_CRASH_AT="+point, "GPUCR_TEST_CRASH_GROUP=1")
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Run(); err == nil {
					t.Fatalf("gpucr was not killed at %q:\n%s", point, out.String())
				}
				host.checkClean(t)
				complete := false
				if streamed {
					ls, _ := gpucr(t, "ls", storeDir)
					complete = strings.Contains(ls, dir)
				} else if _, err := os.Stat(dir); err == nil {
					mustGpucr(t, "verify", dir)
					complete = true
				}
				if complete && !testutil.Alive(w.pid) {
					return // killed after its commit: the checkpoint holds the job
				}
				if !testutil.Alive(w.pid) {
					b, _ := os.ReadFile(filepath.Join(host.run, "recovery.log"))
					t.Fatalf("job lost: the workload is dead (GPU state %s) and no checkpoint is complete\n%s", drv.state(w.pid), b)
				}
				untraced(t, w.pid)
				if st := drv.state(w.pid); st != "0" {
					t.Fatalf("GPU state %s after the rollback, want 0 (running)", st)
				}
				w.checkRunsOn(t, "gpucr's process group was killed at "+point)
				if maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", w.pid)); slices.ContainsFunc(strings.Split(string(maps), "\n"),
					func(l string) bool { return strings.Contains(l, "CRIU") }) {
					t.Errorf("CRIU's parasite is left mapped in the workload:\n%s", maps)
				}
			})
		}
	}
}
