package e2e

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/freezer"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
)

// The GPU driver cannot lock a process that does not run (its calls wait for as long as it
// stays stopped): a GPU process stopped by a signal, or frozen with its cgroup (a paused
// container), is refused in one line before anything is locked, and left as it was.
func TestStoppedOrFrozenGPUProcessIsRefused(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	for _, c := range []struct {
		name, want string
		stop       func(t *testing.T, pid int) (resume func())
	}{
		{"stopped", "kill -CONT", func(t *testing.T, pid int) func() {
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 200; i++ {
				if p, _ := proctree.Read(pid); p.State == 'T' {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			return func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
		}},
		{"frozen", "frozen with its cgroup", func(t *testing.T, pid int) func() {
			testutil.FreezeInCgroup(t, pid)
			return func() {
				if c, err := freezer.Holding(pid); err == nil && c != nil {
					_ = c.Thaw()
				}
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			host, w, dir := crashSetup(t, drv)
			resume := c.stop(t, w.pid)
			out, errOut, code := gpucrEnv(t, drv.env, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", dir}, host.flags()...)...)
			if code == 0 || !oneLineWith(errOut, c.want) {
				t.Fatalf("checkpoint of a %s GPU process: exit %d, want one line saying %q\n%s%s", c.name, code, c.want, out, errOut)
			}
			if st := drv.state(w.pid); st != "0" {
				t.Fatalf("GPU state %s after the refusal, want 0: nothing may be locked", st)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("image directory left by a refused checkpoint: %v", err)
			}
			host.checkClean(t)
			resume()
			w.checkRunsOn(t, "a refused checkpoint of a "+c.name+" process")
		})
	}
}
