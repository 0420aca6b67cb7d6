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
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
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
				killedWithGroupAt(t, point, drv.env, append(append([]string{"checkpoint", strconv.Itoa(w.pid)}, where...), host.flags()...)...)
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

// A container checkpoint killed with gpucr's process group loses no container. runc, and
// the CRIU it starts, run in gpucr's group and die with it; CRIU's dump of a paused
// container is timed from the moment CRIU seizes the container's init (its tracer is set),
// and the kills land from then on through the dump.
func TestContainerCheckpointKilledWithItsProcessGroupLosesNoJob(t *testing.T) {
	needRunc(t)
	drv := newFakeDriver(t)
	for _, ms := range []int{0, 2, 5, 10, 20, 40, 80, 160} {
		t.Run(fmt.Sprintf("seized+%dms", ms), func(t *testing.T) {
			host := newCrashHost(t)
			c := startContainerCheckpoint(t, drv, host, fmt.Sprintf("group%d", ms))
			cmd, pid, bundle, dir, out := c.cmd, c.pid, c.bundle, c.dir, c.out
			time.Sleep(time.Duration(ms) * time.Millisecond)
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // as timeout -s KILL does
			if err := cmd.Wait(); err == nil {
				t.Fatalf("gpucr finished before it was killed:\n%s", out.String())
			}
			host.checkClean(t)
			if !testutil.Alive(pid) {
				if _, err := os.Stat(dir); err == nil {
					mustGpucr(t, "verify", dir)
					return // killed after the dump was committed: the checkpoint holds the job
				}
				b, _ := os.ReadFile(filepath.Join(host.run, "recovery.log"))
				t.Fatalf("job lost: the container's init is dead and no checkpoint was kept\n%s", b)
			}
			untraced(t, pid)
			if st := drv.state(pid); st != "0" {
				t.Fatalf("GPU state %s after the rollback, want 0 (running)", st)
			}
			waitContainerCount(t, bundle, count(t, bundle)+3) // running, not left paused
			onlyImages(t, dir)
		})
	}
}

// waitTraced waits until CRIU has seized pid.
func waitTraced(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if tr, err := proctree.Tracer(pid); err == nil && tr != 0 {
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
	t.Fatalf("CRIU did not seize PID %d in 30 s", pid)
}

// killedWithGroupAt runs gpucr with args as the leader of a process group of its own, armed
// to kill that whole group at point, as timeout -s KILL would, and fails t unless it died so.
func killedWithGroupAt(t *testing.T, point string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin.gpucr, args...)
	cmd.Env = append(append(os.Environ(), env...), "GPUCR_TEST_CRASH_AT="+point, "GPUCR_TEST_CRASH_GROUP=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err == nil {
		t.Fatalf("gpucr was not killed at %q:\n%s", point, out.String())
	}
}

// A container checkpoint interrupted (Ctrl-C to the terminal's group, SIGTERM to gpucr) while
// CRIU dumps never leaves the container paused: runc's checkpoint was SIGKILLed by the
// interrupt, its CRIU dumped on, orphaned, the resume found the container not paused, and
// CRIU, once done, froze it again for good (hostile test). Either the checkpoint finished
// and holds the job, or the container counts on.
func TestContainerCheckpointInterruptedLeavesNoPausedContainer(t *testing.T) {
	needRunc(t)
	drv := newFakeDriver(t)
	for _, c := range []struct {
		name  string
		sig   syscall.Signal
		group bool
	}{{"SIGINT to the group", syscall.SIGINT, true}, {"SIGTERM to gpucr", syscall.SIGTERM, false}} {
		for _, ms := range []int{0, 20, 80} {
			t.Run(fmt.Sprintf("%s seized+%dms", c.name, ms), func(t *testing.T) {
				host := newCrashHost(t)
				ck := startContainerCheckpoint(t, drv, host, fmt.Sprintf("int%d%d", c.sig, ms))
				cmd, pid, bundle, dir, out := ck.cmd, ck.pid, ck.bundle, ck.dir, ck.out
				time.Sleep(time.Duration(ms) * time.Millisecond)
				target := cmd.Process.Pid
				if c.group {
					target = -target
				}
				_ = syscall.Kill(target, c.sig)
				_ = cmd.Wait()
				if !testutil.Alive(pid) {
					if _, err := os.Stat(dir); err == nil {
						mustGpucr(t, "verify", dir)
						return // interrupted after the commit: the checkpoint holds the job
					}
					t.Fatalf("job lost: the container's init is dead and no checkpoint was kept\n%s", out.String())
				}
				untraced(t, pid)
				waitContainerCount(t, bundle, count(t, bundle)+3) // running, not left paused
				onlyImages(t, dir)
			})
		}
	}
}

// containerCheckpoint is `gpucr checkpoint --container` of a counting container, under way.
type containerCheckpoint struct {
	cmd         *exec.Cmd // gpucr, the leader of a process group of its own
	pid         int       // the container's init
	bundle, dir string    // the container's bundle; the image directory
	out         *bytes.Buffer
}

// startContainerCheckpoint starts a container named after name and gpucr's checkpoint of it,
// and returns once CRIU has seized the container's init.
func startContainerCheckpoint(t *testing.T, drv *fakeDriver, host crashHost, name string) containerCheckpoint {
	t.Helper()
	runc, bundle, id, _ := counterContainer(t, name, "-mib", "12")
	pid := runcInitPID(t, runc, id)
	drv.claim(t, pid)
	dir := filepath.Join(t.TempDir(), "img")
	cmd := exec.Command(bin.gpucr, append([]string{"checkpoint", "--container", id, "-D", dir}, host.flags()...)...)
	cmd.Env = append(os.Environ(), drv.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitTraced(t, pid)
	return containerCheckpoint{cmd: cmd, pid: pid, bundle: bundle, dir: dir, out: out}
}
